"""cuDNN fallback: a runtime failure of a cuDNN-served call demotes cuDNN for the process and retries it."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend as B

from invokeai.backend.attention import attention_caller, attention_stats, devices, install_attention, sdpa_window

REAL_SDPA = F.scaled_dot_product_attention


class CudnnThatFails:
    """Stands in for PyTorch's SDPA on a card where cuDNN attention raises at run time."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.failures = 0
        self.calls = 0

    def __call__(self, q, k, v, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        if devices.fused_sdp_choice(q, k, v) == int(B.CUDNN_ATTENTION):
            self.failures += 1
            raise self.error
        return REAL_SDPA(q, k, v, *args, **kwargs)


@pytest.fixture
def failing_cudnn(stand_in_gpu, dispatcher) -> Callable[[BaseException], CudnnThatFails]:  # type: ignore[no-untyped-def]
    dispatcher("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")  # no flash: cuDNN serves under auto

    def make(error: BaseException) -> CudnnThatFails:
        fake = CudnnThatFails(error)
        F.scaled_dot_product_attention = fake  # install_attention wraps whatever SDPA is bound
        return fake

    return make


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
    assert stats.order == ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]
    order = torch._C._get_sdp_priority_order()
    assert order.index(int(B.EFFICIENT_ATTENTION)) < order.index(int(B.CUDNN_ATTENTION))
    assert stats.counts["krea2_denoise"] == {"EFFICIENT_ATTENTION": 1}


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


def test_a_pinned_cudnn_demoted_puts_flash_first_again_and_reports_demoted(failing_cudnn, dispatcher, caplog) -> None:  # type: ignore[no-untyped-def]
    failing_cudnn(RuntimeError("cudnn internal assert"))
    dispatcher("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    install_attention("cudnn")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("sd_denoise"):
        F.scaled_dot_product_attention(q, q, q)
    stats = attention_stats()
    assert stats.order == ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]
    assert [(r["serving"], r["reason"]) for r in stats.reports] == [("FLASH_ATTENTION", "demoted")]
    assert "demoted after a runtime failure" in stats.reports[0]["message"]


def test_out_of_memory_is_not_a_cudnn_failure(failing_cudnn) -> None:  # type: ignore[no-untyped-def]
    failing_cudnn(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB"))
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(torch.OutOfMemoryError):
        F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().cudnn_demoted is False


def test_an_exclusive_cudnn_window_fails_visibly_instead_of_falling_back(failing_cudnn) -> None:  # type: ignore[no-untyped-def]
    failing_cudnn(RuntimeError("cuDNN Frontend error"))
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(RuntimeError, match="cuDNN Frontend error"), sdpa_window("cudnn"):
        F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().cudnn_demoted is False


def test_errors_from_other_kernels_are_not_retried(stand_in_gpu, dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("EFFICIENT_ATTENTION", "MATH")
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, q[..., :4], q)
    assert attention_stats().cudnn_demoted is False
