"""Which torch device and dtype the models run on, from the `device` and `precision` settings."""

from __future__ import annotations

from collections.abc import Callable

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def _xpu_available() -> bool:
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def _mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def _cuda_bf16_native(device: torch.device) -> bool:
    # Emulated bf16 (pre-Ampere) runs far slower than fp16, so only native support counts.
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported(including_emulation=False)


def choose_device(setting: str) -> torch.device:
    """`auto` picks CUDA (ROCm included), then XPU, then MPS, then the CPU; anything else must name an available
    device (`cpu`, `cuda`, `cuda:N`, `mps`, `xpu`, `xpu:N`), so a typo or a missing GPU fails at startup rather than
    at the first generation."""
    text = setting.strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if _xpu_available():
            return torch.device("xpu", 0)
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {setting!r}: use auto, cpu, cuda, cuda:N, mps or xpu") from exc
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        _check_index(setting, device, torch.cuda.is_available(), torch.cuda.device_count)
        return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    if device.type == "xpu":
        _check_index(setting, device, _xpu_available(), lambda: torch.xpu.device_count())
        return device if device.index is not None else torch.device("xpu", 0)
    if device.type == "mps":
        if not _mps_available():
            raise ValueError(f"device {setting!r} is not available on this machine")
        return device
    raise ValueError(f"unsupported device {setting!r}: use auto, cpu, cuda, cuda:N, mps or xpu")


def _check_index(setting: str, device: torch.device, available: bool, count: Callable[[], int]) -> None:
    if not available:
        raise ValueError(f"device {setting!r} is not available on this machine")
    if device.index is not None and device.index >= count():
        raise ValueError(f"device {setting!r} does not exist: this machine has {count()} {device.type} device(s)")


def choose_dtype(setting: str, device: torch.device) -> torch.dtype:
    """`auto`: float32 on the CPU and MPS (half-precision matmuls there are slow or lossy), bfloat16 on CUDA/XPU where
    natively supported, else float16 (bfloat16's range avoids fp16 overflow in large activations). An explicit dtype
    is taken as given on any device."""
    text = setting.strip().lower()
    if text == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if _cuda_bf16_native(device) else torch.float16
        if device.type == "xpu":
            return torch.bfloat16
        return torch.float32
    try:
        return DTYPES[text]
    except KeyError:
        raise ValueError(f"unknown precision {setting!r}: use auto, float32, float16 or bfloat16") from None
