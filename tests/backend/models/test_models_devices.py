"""choose_device / choose_dtype: the settings' rules, with the accelerators' availability faked on a CPU machine."""

from __future__ import annotations

import pytest
import torch

from invokeai.backend import devices


@pytest.fixture
def no_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "_xpu_available", lambda: False)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)


@pytest.fixture
def two_cudas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


def test_auto_is_cpu_without_accelerators(no_accelerators: None) -> None:
    assert devices.choose_device("auto") == torch.device("cpu")
    assert devices.choose_device(" CPU ") == torch.device("cpu")


def test_auto_prefers_cuda_current_device(two_cudas: None) -> None:
    assert devices.choose_device("auto") == torch.device("cuda", 1)
    assert devices.choose_device("cuda") == torch.device("cuda", 1)
    assert devices.choose_device("cuda:0") == torch.device("cuda", 0)


def test_auto_falls_back_to_xpu_then_mps(no_accelerators: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "_mps_available", lambda: True)
    assert devices.choose_device("auto") == torch.device("mps")
    monkeypatch.setattr(devices, "_xpu_available", lambda: True)
    assert devices.choose_device("auto") == torch.device("xpu", 0)


def test_cuda_index_beyond_count_is_refused(two_cudas: None) -> None:
    with pytest.raises(ValueError, match="has 2 cuda"):
        devices.choose_device("cuda:2")


@pytest.mark.parametrize("setting", ["cuda", "cuda:0", "mps", "xpu"])
def test_unavailable_device_is_refused(no_accelerators: None, setting: str) -> None:
    with pytest.raises(ValueError, match="not available"):
        devices.choose_device(setting)


@pytest.mark.parametrize("setting", ["gpu", "cuda:x", "meta"])
def test_unknown_device_is_refused(setting: str) -> None:
    with pytest.raises(ValueError, match="device"):
        devices.choose_device(setting)


def test_auto_dtype_by_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert devices.choose_dtype("auto", torch.device("cpu")) is torch.float32
    assert devices.choose_dtype("auto", torch.device("mps")) is torch.float32
    monkeypatch.setattr(devices, "_cuda_bf16_native", lambda device: True)
    assert devices.choose_dtype("auto", torch.device("cuda", 0)) is torch.bfloat16
    monkeypatch.setattr(devices, "_cuda_bf16_native", lambda device: False)
    assert devices.choose_dtype("auto", torch.device("cuda", 0)) is torch.float16


@pytest.mark.parametrize(
    ("setting", "dtype"),
    [("float32", torch.float32), ("FP16", torch.float16), ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16)],
)
def test_explicit_dtype_is_taken_as_given(setting: str, dtype: torch.dtype) -> None:
    assert devices.choose_dtype(setting, torch.device("cpu")) is dtype


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        devices.choose_dtype("half", torch.device("cpu"))
