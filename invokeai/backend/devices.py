"""Devices for the whole backend: which device and dtype the models run on (from the `device` and `precision`
settings), and what the attention patch needs to know about devices.

The attention half is also the test seam that lets a CPU-only machine stand in for a GPU: PyTorch's CPU backend
ignores the kernel order and has neither cuDNN nor memory-efficient attention, so tests replace
`is_reported_tensor`, `has_reported_device`, `has_cuda`, `is_sage_tensor`, `is_sage_device`, `fused_sdp_choice` and
`kernel_can_serve`
(before `install_attention`, which captures them) to exercise the GPU paths. Torch only: the attention package
imports this module and must run where torch alone is installed.
"""

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


def available_devices() -> list[tuple[str, str]]:
    """Every device this machine could generate on, as (the generation_devices entry naming it, a name for people):
    each CUDA (or ROCm) GPU by index, Apple's MPS, each Intel XPU, and the CPU."""
    found = []
    if torch.cuda.is_available():
        found += [(f"cuda:{index}", torch.cuda.get_device_name(index)) for index in range(torch.cuda.device_count())]
    if _mps_available():
        found.append(("mps", "Apple MPS"))
    if _xpu_available():
        found += [(f"xpu:{index}", torch.xpu.get_device_name(index)) for index in range(torch.xpu.device_count())]
    found.append(("cpu", "CPU"))
    return found


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


def choose_generation_devices(setting: str | list[str], device_setting: str) -> list[torch.device]:
    """The devices of the session workers, one worker each. `auto`: every CUDA device; without one, the single
    device that `device_setting` picks (the CPU, MPS or XPU). A list is taken as given, each entry checked against
    this machine (a CUDA index it lacks raises ValueError); `cpu` may repeat, for several CPU workers."""
    if setting == "auto":
        if torch.cuda.is_available():
            return [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
        return [choose_device(device_setting)]
    return [choose_device(entry) for entry in setting]


def worker_names(devices: list[torch.device]) -> list[str]:
    """One name per worker: an indexed device's own name (cuda:1), else its type and the worker's number among
    the workers on it (cpu#0, cpu#1, mps#0), so that names stay distinct and stable across restarts."""
    labels = [str(canonical_device(device)) for device in devices]
    return [label if ":" in label else f"{label}#{labels[:index].count(label)}" for index, label in enumerate(labels)]


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


def canonical_device(device: torch.device | str) -> torch.device:
    """`cuda` and `cuda:0` (when 0 is the current device) are one device; an index is filled in where the device
    type has one, so two spellings of a device compare equal."""
    device = torch.device(device)
    if device.index is not None or device.type not in ("cuda", "xpu"):
        return device
    module = getattr(torch, device.type)
    return torch.device(device.type, module.current_device() if module.is_available() else 0)


def is_reported_tensor(tensor: torch.Tensor) -> bool:
    """Tensors whose device walks the installed kernel order: CUDA (and ROCm, which is torch's "cuda") and XPU.
    The CPU picks its kernel itself and MPS has its own, so pins are neither reported nor meaningful there."""
    return tensor.is_cuda or tensor.is_xpu


def has_reported_device() -> bool:
    """Whether this process can see a device whose attention calls get reported."""
    return torch.cuda.is_available() or _xpu_available()


def has_cuda() -> bool:
    return torch.cuda.is_available()


def is_rocm() -> bool:
    return torch.version.hip is not None


def is_sage_tensor(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def is_sage_device(device: torch.device) -> bool:
    return device.type == "cuda"


# PyTorch's own answer to "which kernel serves this call under the current flags and order", as an SDPBackend
# value; it raises when no kernel can. Tests replace it with a function of the same signature.
fused_sdp_choice = torch._fused_sdp_choice


def _pytorch_can_serve(kernel: str, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:  # type: ignore[no-untyped-def]
    """PyTorch's own eligibility check of one kernel for one call (the checks its dispatcher walks the order with,
    the kernel's enable flag included); math serves every call the dispatcher accepts."""
    if kernel == "MATH":
        return True
    can_use = {
        "FLASH_ATTENTION": torch.backends.cuda.can_use_flash_attention,
        "EFFICIENT_ATTENTION": torch.backends.cuda.can_use_efficient_attention,
        "CUDNN_ATTENTION": getattr(torch.backends.cuda, "can_use_cudnn_attention", None),
    }.get(kernel)
    if can_use is None:
        return False
    params = torch.backends.cuda.SDPAParams(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    return bool(can_use(params, False))


# Whether one kernel (by PyTorch's name) can serve a call: (kernel, q, k, v, attn_mask, dropout_p, is_causal,
# enable_gqa) -> bool. Tests replace it with the stand-in dispatcher's rules.
kernel_can_serve = _pytorch_can_serve
