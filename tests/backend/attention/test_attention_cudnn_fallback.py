"""cuDNN fallback: a run-time failure of a cuDNN-served call demotes cuDNN behind math and retries the call."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend as B

from invokeai.backend import devices
from invokeai.backend.attention import attention_caller, attention_stats, install_attention, uninstall_attention
from invokeai.backend.attention.benchmarking import sdpa_window
from invokeai.backend.attention.policy import read_flags
from invokeai.backend.attention.state import STATE
from invokeai.backend.attention.testing import GPU_RULES, any_call

REAL_SDPA = F.scaled_dot_product_attention


class CudnnThatFails:
    """Stands in for PyTorch's SDPA on a card where cuDNN attention raises at run time: whenever the dispatcher
    would send the call (all of its arguments) to cuDNN."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.failures = 0
        self.calls = 0
        self.on_failure: Callable[[], None] = lambda: None

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        *,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        self.calls += 1
        choice = devices.fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if choice == int(B.CUDNN_ATTENTION):
            self.failures += 1
            self.on_failure()
            raise self.error
        return REAL_SDPA(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


@pytest.fixture
def failing_cudnn(stand_in_gpu, dispatcher) -> Callable[[BaseException], CudnnThatFails]:  # type: ignore[no-untyped-def]
    dispatcher("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")  # no flash: cuDNN serves under auto

    def make(error: BaseException) -> CudnnThatFails:
        fake = CudnnThatFails(error)
        F.scaled_dot_product_attention = fake  # install_attention wraps whatever SDPA is bound
        return fake

    return make


def _masked_gqa_call() -> tuple[torch.Tensor, ...]:
    """A masked grouped-query call: under GPU_RULES only cuDNN and math serve it."""
    q = torch.randn(1, 4, 8, 64)
    kv = torch.randn(1, 2, 8, 64)
    mask = torch.zeros(8, 8)
    return q, kv, kv, mask


def _gqa_call() -> tuple[torch.Tensor, ...]:
    """An unmasked grouped-query call: under GPU_RULES flash serves it."""
    q = torch.randn(1, 4, 8, 64)
    kv = torch.randn(1, 2, 8, 64)
    return q, kv, kv


def test_a_cudnn_failure_demotes_cudnn_and_the_call_completes(failing_cudnn, caplog) -> None:  # type: ignore[no-untyped-def]
    failing_cudnn(RuntimeError("cuDNN Frontend error: No execution plans support the graph."))
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("krea2_denoise"):
        out = F.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(out, REAL_SDPA(q, q, q))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cuDNN attention failed in krea2_denoise: cuDNN Frontend error: No execution plans" in warnings[0]
    stats = attention_stats()
    assert stats.cudnn_demoted is True
    assert stats.order == ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION"]
    order = torch._C._get_sdp_priority_order()
    assert order.index(int(B.MATH)) < order.index(int(B.CUDNN_ATTENTION))
    assert stats.counts["krea2_denoise"] == {"EFFICIENT_ATTENTION": 1}
    assert [(e.event, e.node_type) for e in stats.events] == [("cudnn_demoted", "krea2_denoise")]


def test_later_calls_pay_no_retry(failing_cudnn) -> None:  # type: ignore[no-untyped-def]
    fake = failing_cudnn(RuntimeError("CUDNN_STATUS_BAD_PARAM"))
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    F.scaled_dot_product_attention(q, q, q)
    calls_after_first = fake.calls
    for _ in range(5):
        F.scaled_dot_product_attention(q, q, q)
    assert fake.failures == 1
    assert fake.calls == calls_after_first + 5


def test_a_pinned_cudnn_demoted_puts_flash_first_again_and_reports_demoted(failing_cudnn, dispatcher) -> None:  # type: ignore[no-untyped-def]
    failing_cudnn(RuntimeError("cudnn internal assert"))
    dispatcher("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    install_attention("cudnn")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("sd_denoise"):
        F.scaled_dot_product_attention(q, q, q)
    stats = attention_stats()
    assert stats.order == ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION"]
    assert [(r.serving, r.reason) for r in stats.reports] == [("FLASH_ATTENTION", "demoted")]
    assert "demoted after a run-time failure" in stats.reports[0].message


def test_out_of_memory_is_not_a_cudnn_failure(failing_cudnn) -> None:  # type: ignore[no-untyped-def]
    failing_cudnn(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB"))
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(torch.OutOfMemoryError):
        F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().cudnn_demoted is False


def test_a_plain_runtime_error_saying_out_of_memory_is_out_of_memory(failing_cudnn) -> None:  # type: ignore[no-untyped-def]
    # cuDNN's workspace allocation and other allocators raise a plain RuntimeError: still memory, not a cuDNN defect.
    fake = failing_cudnn(RuntimeError("CUDA error: out of memory (cudnn workspace)"))
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(RuntimeError, match="out of memory"):
        F.scaled_dot_product_attention(q, q, q)
    stats = attention_stats()
    assert stats.cudnn_demoted is False and stats.events == []
    assert stats.order == ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]
    assert fake.failures == 1


def test_an_exclusive_cudnn_window_fails_visibly_instead_of_falling_back(failing_cudnn) -> None:  # type: ignore[no-untyped-def]
    failing_cudnn(RuntimeError("cuDNN Frontend error"))
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(RuntimeError, match="cuDNN Frontend error"), sdpa_window("cudnn", "INVOKE_KREA2_SDPA_BACKEND"):
        F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().cudnn_demoted is False


def test_errors_from_other_kernels_are_not_retried(stand_in_gpu, dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("EFFICIENT_ATTENTION", "MATH")
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, q[..., :4], q)
    assert attention_stats().cudnn_demoted is False


def test_a_demotion_keeps_every_kernel_that_was_ahead_of_cudnn_ahead(failing_cudnn, dispatcher) -> None:  # type: ignore[no-untyped-def]
    # With efficient pinned the order is efficient, flash, cuDNN, math. Moving cuDNN only "behind efficient" would
    # put it above flash, and send the calls flash serves to the kernel that just failed, with no fallback left.
    fake = failing_cudnn(RuntimeError("cuDNN Frontend error: No execution plans support the graph."))
    dispatcher(GPU_RULES)
    install_attention("efficient")
    flash_call = _gqa_call()
    with attention_caller("node"):
        F.scaled_dot_product_attention(*flash_call, enable_gqa=True)
        assert attention_stats().counts["node"] == {"FLASH_ATTENTION": 1}
        F.scaled_dot_product_attention(*_masked_gqa_call(), enable_gqa=True)  # cuDNN fails: demoted
        assert attention_stats().cudnn_demoted is True
        out = F.scaled_dot_product_attention(*flash_call, enable_gqa=True)
    torch.testing.assert_close(out, REAL_SDPA(*flash_call, enable_gqa=True))
    stats = attention_stats()
    assert stats.order == ["EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH", "CUDNN_ATTENTION"]
    order = torch._C._get_sdp_priority_order()
    assert order.index(int(B.FLASH_ATTENTION)) < order.index(int(B.CUDNN_ATTENTION))
    assert stats.counts["node"] == {"FLASH_ATTENTION": 2, "MATH": 1}
    assert fake.failures == 1


def test_the_retry_of_a_call_the_next_kernel_cannot_serve_runs_on_math(failing_cudnn, dispatcher) -> None:  # type: ignore[no-untyped-def]
    # Neither efficient (grouped-query) nor flash (masked) serves it: the retry must not reach cuDNN again.
    fake = failing_cudnn(RuntimeError("CUDNN_STATUS_BAD_PARAM"))
    dispatcher(GPU_RULES)
    install_attention("efficient")
    call = _masked_gqa_call()
    with attention_caller("node"):
        out = F.scaled_dot_product_attention(*call, enable_gqa=True)
    torch.testing.assert_close(out, REAL_SDPA(*call, enable_gqa=True))
    assert fake.failures == 1
    assert attention_stats().counts["node"] == {"MATH": 1}
    assert len(attention_stats().events) == 1


def test_a_second_failure_raises_once_and_never_recurses(failing_cudnn, dispatcher) -> None:  # type: ignore[no-untyped-def]
    # A device where only cuDNN serves the call: the retry lands on cuDNN (behind math, but nothing else can take
    # it) and fails again. It must raise that error, once, not demote again and retry without end.
    fake = failing_cudnn(RuntimeError("cuDNN Frontend error: No execution plans support the graph."))
    dispatcher("CUDNN_ATTENTION")
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(RuntimeError, match="No execution plans") as raised:
        F.scaled_dot_product_attention(q, q, q)
    assert raised.type is RuntimeError  # not RecursionError, a RuntimeError subclass
    assert fake.failures == 2
    stats = attention_stats()
    assert [e.event for e in stats.events] == ["cudnn_demoted"]
    assert stats.cudnn_demoted is True


def test_after_a_demotion_the_fallback_layer_is_gone(failing_cudnn) -> None:  # type: ignore[no-untyped-def]
    failing_cudnn(RuntimeError("cuDNN Frontend error"))
    install_attention("auto")
    assert attention_stats().layers == ["cudnn_fallback"]
    q = torch.randn(1, 2, 8, 64)
    F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().cudnn_demoted is True
    assert "cudnn_fallback" not in attention_stats().layers
    assert all(layer.name != "cudnn_fallback" for layer in STATE.layers)


def test_a_priority_cudnn_window_after_a_demotion_does_not_send_calls_to_cudnn(failing_cudnn) -> None:  # type: ignore[no-untyped-def]
    # The fallback layer is gone after the demotion, so a window that ranked cuDNN first again would send calls to
    # the kernel that failed with nothing left to catch the failure.
    fake = failing_cudnn(RuntimeError("cuDNN Frontend error"))
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().cudnn_demoted is True
    with sdpa_window("priority-cudnn", "INVOKE_KREA2_SDPA_BACKEND=priority-cudnn"), attention_caller("node"):
        order = torch._C._get_sdp_priority_order()
        assert order.index(int(B.MATH)) < order.index(int(B.CUDNN_ATTENTION))
        out = F.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(out, REAL_SDPA(q, q, q))
    assert attention_stats().counts["node"] == {"EFFICIENT_ATTENTION": 1}
    assert fake.failures == 1


def test_a_later_demoted_report_is_not_hidden_by_an_earlier_cannot_serve(failing_cudnn, dispatcher) -> None:  # type: ignore[no-untyped-def]
    failing_cudnn(RuntimeError("cudnn internal assert"))
    dispatcher({**GPU_RULES, "CUDNN_ATTENTION": lambda call: call.attn_mask is None, "FLASH_ATTENTION": any_call})
    install_attention("cudnn")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("node"):
        F.scaled_dot_product_attention(q, q, q, torch.zeros(8, 8))  # cuDNN takes no mask here: flash serves
        F.scaled_dot_product_attention(q, q, q)  # cuDNN serves, fails, is demoted: flash serves the retry
    assert [(r.node_type, r.serving, r.reason) for r in attention_stats().reports] == [
        ("node", "FLASH_ATTENTION", "cannot_serve"),
        ("node", "FLASH_ATTENTION", "demoted"),
    ]


@pytest.mark.parametrize("setting", ["flash", "efficient"])
def test_only_a_cudnn_pin_reports_a_demotion(setting: str, failing_cudnn, dispatcher) -> None:  # type: ignore[no-untyped-def]
    # cuDNN was not the pinned kernel: it being demoted is not why the pinned kernel did not serve the retry.
    failing_cudnn(RuntimeError("cuDNN Frontend error"))
    dispatcher(GPU_RULES)
    install_attention(setting)
    with attention_caller("node"):
        F.scaled_dot_product_attention(*_masked_gqa_call(), enable_gqa=True)
    stats = attention_stats()
    assert stats.cudnn_demoted is True
    assert [(r.serving, r.reason) for r in stats.reports] == [("MATH", "cannot_serve")]


def test_a_failure_in_a_call_that_outlived_its_install_neither_demotes_nor_patches_again(failing_cudnn) -> None:  # type: ignore[no-untyped-def]
    # Another thread uninstalls while the call runs on cuDNN: the undo must stay exact (the original SDPA and
    # flags), so the failure is retried on the SDPA in place now instead of demoting and rebuilding.
    fake = failing_cudnn(RuntimeError("cuDNN Frontend error"))
    before = read_flags()
    install_attention("auto")
    fake.on_failure = uninstall_attention
    q = torch.randn(1, 2, 8, 64)
    out = F.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(out, REAL_SDPA(q, q, q))
    assert F.scaled_dot_product_attention is fake
    assert read_flags() == before
    stats = attention_stats()
    assert stats.installed is False and stats.cudnn_demoted is False and stats.events == []
