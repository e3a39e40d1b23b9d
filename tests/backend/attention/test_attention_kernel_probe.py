"""The startup probe and the startup warnings."""

from __future__ import annotations

import logging

import pytest

import invokeai.backend.attention.install as install_module
from invokeai.backend.attention import attention_stats, install_attention
from invokeai.backend.attention.kernel_probe import KernelProbe, probe_kernels, unavailable_kernels


def _probe(**can: bool) -> KernelProbe:
    return KernelProbe(
        device="cuda:0 (stand-in)",
        torch="2.x",
        shape=[1, 24, 1024, 128],
        dtype="bfloat16",
        mask="no mask",
        **{"flash": True, "cudnn": True, "efficient": True, "sage": False, **can},
    )


def test_the_probe_says_nothing_on_cpu(caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG, logger="invokeai")
    assert probe_kernels("cpu") is None
    assert caplog.records == []


def test_the_probe_swallows_every_failure(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import torch

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch, "zeros", broken)
    assert probe_kernels("cuda") is None
    assert probe_kernels("xpu") is None


def test_unavailable_kernels_follow_the_probe(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import torch

    monkeypatch.setattr(torch.version, "hip", None)
    assert unavailable_kernels(_probe(flash=False)) == {"FLASH_ATTENTION"}
    assert unavailable_kernels(_probe(cudnn=False, efficient=False)) == {"CUDNN_ATTENTION", "EFFICIENT_ATTENTION"}
    assert unavailable_kernels(None) == set()
    # ROCm builds have no cuDNN attention, whatever the probe says.
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert unavailable_kernels(_probe()) == {"CUDNN_ATTENTION"}


@pytest.fixture
def gpu_without_flash(stand_in_gpu, monkeypatch) -> KernelProbe:  # type: ignore[no-untyped-def]
    probe = _probe(flash=False)
    monkeypatch.setattr(install_module, "probe_kernels", lambda device: probe)
    return probe


def test_a_pinned_kernel_the_device_lacks_is_warned_at_startup(gpu_without_flash, caplog) -> None:  # type: ignore[no-untyped-def]
    install_attention("flash")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1
    assert "attention_backend 'flash': this build or device has no flash kernel" in lines[0]
    assert attention_stats().probe == gpu_without_flash
    assert attention_stats().unavailable == ["FLASH_ATTENTION"]


def test_pinning_math_warns_at_startup(gpu_without_flash, caplog) -> None:  # type: ignore[no-untyped-def]
    install_attention("math")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "materialises the whole score matrix" in lines[0] and "debugging" in lines[0]


@pytest.mark.parametrize("setting", ["auto", "efficient", "cudnn"])
def test_available_pins_and_auto_start_quietly(setting: str, gpu_without_flash, caplog) -> None:  # type: ignore[no-untyped-def]
    install_attention(setting)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
