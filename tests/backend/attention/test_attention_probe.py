"""The startup probe and the startup warnings."""

from __future__ import annotations

import logging

import pytest

from invokeai.backend.attention import attention_stats, install, install_attention
from invokeai.backend.attention.probe import probe_kernels, unavailable_kernels


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


def test_unavailable_kernels_follow_the_probe() -> None:
    probe = {"flash": False, "cudnn": True, "efficient": True}
    assert unavailable_kernels(probe) == {"FLASH_ATTENTION"}
    assert unavailable_kernels(None) == set()


@pytest.fixture
def gpu_without_flash(stand_in_gpu, monkeypatch) -> dict:  # type: ignore[no-untyped-def]
    probe = {"device": "cuda (stand-in)", "flash": False, "cudnn": True, "efficient": True, "sage": False}
    monkeypatch.setattr(install, "probe_kernels", lambda device: probe)
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
