"""The "pinned kernel not possible" report, on the CPU standing in for a GPU."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torch.nn.functional as F

from invokeai.backend import devices
from invokeai.backend.attention import attention_caller, attention_stats, install, install_attention, report
from invokeai.backend.attention.benchmarking import sdpa_window
from invokeai.backend.attention.state import STATE
from invokeai.backend.attention.testing import GPU_RULES

FUSED = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
PRIORITY_CUDNN = "INVOKE_KREA2_SDPA_BACKEND=priority-cudnn"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "not possible" in r.getMessage()]


def _reports() -> list[tuple[str, str, str, str]]:
    return [(r.node_type, r.pinned, r.serving, r.reason) for r in attention_stats().reports]


@pytest.fixture
def gqa_call() -> tuple[torch.Tensor, ...]:
    q = torch.randn(1, 32, 8, 128, dtype=torch.bfloat16)
    kv = torch.randn(1, 8, 8, 128, dtype=torch.bfloat16)
    return q, kv, kv


def _masked_gqa_call() -> tuple[torch.Tensor, ...]:
    q = torch.randn(1, 4, 8, 64)
    kv = torch.randn(1, 2, 8, 64)
    return q, kv, kv, torch.zeros(8, 8)


def test_a_call_the_pinned_kernel_cannot_serve_is_reported_once_per_node(
    stand_in_gpu,
    dispatcher,
    gqa_call,
    caplog,  # type: ignore[no-untyped-def]
) -> None:
    dispatcher("CUDNN_ATTENTION", "MATH")  # this "device" has no memory-efficient kernel for the call
    install_attention("efficient")
    q, k, v = gqa_call
    caplog.set_level(logging.WARNING)
    with attention_caller("krea2_text_encoder"):
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert _warnings(caplog) == [
        "attention_backend 'efficient' is not possible for attention in krea2_text_encoder: the memory-efficient "
        "kernel cannot serve this call (bfloat16, head_dim 128, no mask, 32 query / 8 key-value heads, query "
        "length 8, key length 8, enable_gqa, causal); it runs on CUDNN_ATTENTION."
    ]
    with attention_caller("krea2_denoise"):
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert len(_warnings(caplog)) == 2
    assert _reports() == [
        ("krea2_text_encoder", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "cannot_serve"),
        ("krea2_denoise", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "cannot_serve"),
    ]
    assert attention_stats().counts["krea2_text_encoder"] == {"CUDNN_ATTENTION": 3}


def test_the_report_names_the_serving_kernel_per_distinct_kernel(stand_in_gpu, dispatcher) -> None:  # type: ignore[no-untyped-def]
    stand_in = dispatcher("CUDNN_ATTENTION", "MATH")
    install_attention("flash")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("vae_decode"):
        F.scaled_dot_product_attention(q, q, q)
        del stand_in.rules["CUDNN_ATTENTION"]
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q)
    assert [r.serving for r in attention_stats().reports] == ["CUDNN_ATTENTION", "MATH"]


def test_calls_the_pinned_kernel_serves_are_not_reported(stand_in_gpu, dispatcher, caplog) -> None:  # type: ignore[no-untyped-def]
    dispatcher(*FUSED)
    install_attention("efficient")
    q = torch.randn(1, 2, 8, 64)
    F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().reports == [] and _warnings(caplog) == []
    assert attention_stats().counts["(no node)"] == {"EFFICIENT_ATTENTION": 1}


def test_auto_reports_nothing(stand_in_gpu, dispatcher, caplog) -> None:  # type: ignore[no-untyped-def]
    dispatcher("MATH")
    install_attention("auto")
    q = torch.randn(1, 2, 8, 64)
    F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().reports == [] and _warnings(caplog) == []


def test_cpu_tensors_are_not_reported(caplog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A GPU install (has_reported_device) running some attention on the CPU: the pin never applied there.
    monkeypatch.setattr(devices, "has_reported_device", lambda: True)
    install_attention("efficient")
    q = torch.randn(1, 2, 8, 64)
    F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().reports == [] and _warnings(caplog) == []


def test_unavailable_kernel_reason(stand_in_gpu, dispatcher, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    dispatcher("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    monkeypatch.setattr(install, "unavailable_kernels", lambda probe: frozenset({"FLASH_ATTENTION"}))
    install_attention("flash")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("sd_denoise"):
        F.scaled_dot_product_attention(q, q, q)
    (message,) = _warnings(caplog)
    assert "this build or device has no flash kernel; it runs on CUDNN_ATTENTION." in message
    assert attention_stats().reports[0].reason == "unavailable"


def test_exclusive_window_reason(stand_in_gpu, dispatcher, caplog) -> None:  # type: ignore[no-untyped-def]
    dispatcher(*FUSED)
    install_attention("efficient")
    q = torch.randn(1, 2, 8, 64)
    # math, because the real CPU kernel behind the stand-in must be able to run the call alone.
    with sdpa_window("math", "INVOKE_KREA2_SDPA_BACKEND=math"), attention_caller("krea2_denoise"):
        F.scaled_dot_product_attention(q, q, q)
    (message,) = _warnings(caplog)
    assert "the exclusive INVOKE_KREA2_SDPA_BACKEND=math window switched it off; it runs on MATH." in message
    assert attention_stats().reports[0].reason == "window"


def test_pytorchs_own_reason_follows_once_on_stderr(stand_in_gpu, dispatcher, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    def can_use(params, debug):  # type: ignore[no-untyped-def]
        if debug:
            warnings.warn("Memory efficient kernel does not support this head_dim", UserWarning, stacklevel=1)
        return False

    monkeypatch.setitem(report._CAN_USE, "EFFICIENT_ATTENTION", can_use)
    dispatcher("CUDNN_ATTENTION")
    install_attention("efficient")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("node"):
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q)
    err = capsys.readouterr().err
    assert err.count("Memory efficient kernel does not support this head_dim") == 1
    assert "EFFICIENT_ATTENTION did not serve it" in err


def test_a_pin_on_a_cpu_only_install_is_said_once_at_startup(caplog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(devices, "has_reported_device", lambda: False)  # also on a GPU machine
    caplog.set_level(logging.INFO)
    install_attention("cudnn")
    lines = [r for r in caplog.records if "has no effect on cpu" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


def test_a_rebind_does_not_report_again(stand_in_gpu, dispatcher) -> None:  # type: ignore[no-untyped-def]
    # A rebuild (a demotion, Sage switched off) composes a new report layer; what was reported stays reported.
    dispatcher("FLASH_ATTENTION", "MATH")
    install_attention("efficient")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("node_a"):
        F.scaled_dot_product_attention(q, q, q)
        install.rebind(STATE)
        STATE.apply()  # a new state version too, so the rebuilt layer looks at the call again
        F.scaled_dot_product_attention(q, q, q)
    assert len(attention_stats().reports) == 1


def test_one_node_serving_kernel_with_two_reasons_gives_two_reports(stand_in_gpu, dispatcher, caplog) -> None:  # type: ignore[no-untyped-def]
    dispatcher(GPU_RULES)
    install_attention("efficient")
    call = _masked_gqa_call()
    with attention_caller("node"):
        F.scaled_dot_product_attention(*call, enable_gqa=True)
        with sdpa_window("priority-cudnn", PRIORITY_CUDNN):
            F.scaled_dot_product_attention(*call, enable_gqa=True)
            F.scaled_dot_product_attention(*call, enable_gqa=True)
    assert _reports() == [
        ("node", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "cannot_serve"),
        ("node", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "window"),
    ]
    assert len(_warnings(caplog)) == 2


def test_a_priority_window_reason_says_the_window_outranked_the_pin(stand_in_gpu, dispatcher, caplog) -> None:  # type: ignore[no-untyped-def]
    # Efficient serves this call: under the window cuDNN runs it only because the window ranked cuDNN first, and
    # the report must say so rather than blame the pinned kernel. Once the window is closed, the same node's
    # cuDNN-served call (one efficient cannot serve) is a state the report has not looked at yet.
    dispatcher(GPU_RULES)
    install_attention("efficient")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("node"):
        with sdpa_window("priority-cudnn", PRIORITY_CUDNN):
            F.scaled_dot_product_attention(q, q, q)
        assert attention_stats().counts["node"] == {"CUDNN_ATTENTION": 1}
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(*_masked_gqa_call(), enable_gqa=True)
    assert attention_stats().counts["node"] == {"CUDNN_ATTENTION": 2, "EFFICIENT_ATTENTION": 1}
    assert _reports() == [
        ("node", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "window"),
        ("node", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "cannot_serve"),
    ]
    first, second = _warnings(caplog)
    assert (
        "in node: the INVOKE_KREA2_SDPA_BACKEND=priority-cudnn window ranked the cuDNN kernel above it; it runs on "
        "CUDNN_ATTENTION." in first
    )
    assert "cannot serve" not in first
    assert "the memory-efficient kernel cannot serve this call" in second


def test_calls_that_raise_are_not_reported(stand_in_gpu, dispatcher, caplog) -> None:  # type: ignore[no-untyped-def]
    # The stand-in sends the call to flash; PyTorch's SDPA then refuses its shapes. Nothing ran on flash.
    dispatcher("FLASH_ATTENTION", "MATH")
    install_attention("efficient")
    q = torch.randn(1, 2, 8, 64)
    with attention_caller("node"), pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, q[..., :4], q)
    assert attention_stats().reports == [] and _warnings(caplog) == []
    with attention_caller("node"):
        F.scaled_dot_product_attention(q, q, q)
    assert _reports() == [("node", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "cannot_serve")]


def test_a_pin_on_a_cpu_only_machine_composes_no_report_layer(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The CPU picks its kernel itself: there is nothing to report, so the pin costs its calls nothing.
    monkeypatch.setattr(devices, "has_reported_device", lambda: False)
    monkeypatch.setattr(devices, "has_cuda", lambda: False)
    monkeypatch.setattr(devices, "is_rocm", lambda: False)
    install_attention("efficient")
    assert attention_stats().layers == []
    assert STATE.layers == ()
