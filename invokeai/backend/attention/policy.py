"""The ranking: kernel names, the order each setting installs, a cuDNN demotion, and PyTorch's process-wide flags.

`torch.nn.attention.sdpa_kernel(order, set_priority=True)` does the same on entry, but it is a context manager that
restores on exit; the server holds one order for the life of the process and changes it on a cuDNN demotion or a
benchmarking window, so the same two steps (enable the flags, then set the priority order) are applied here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend.attention.settings import check_setting

# Flash leads where the build has it (fastest on Linux CUDA for the Krea-2 shape); cuDNN comes next because it
# serves the additive padding masks flash refuses, at 1.6-2x the memory-efficient kernel; math is the last resort.
AUTO_ORDER: tuple[SDPBackend, ...] = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)

PINNED_KERNELS: dict[str, SDPBackend] = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}

KERNEL_PHRASES: dict[SDPBackend, str] = {
    SDPBackend.FLASH_ATTENTION: "the flash kernel",
    SDPBackend.CUDNN_ATTENTION: "the cuDNN kernel",
    SDPBackend.EFFICIENT_ATTENTION: "the memory-efficient kernel",
    SDPBackend.MATH: "the math kernel",
}


def pinned_kernel(setting: str) -> SDPBackend | None:
    """The kernel a setting puts first, or None for auto and sage (which rank PyTorch's kernels as auto does)."""
    return PINNED_KERNELS.get(check_setting(setting))


def kernel_order(setting: str) -> list[SDPBackend]:
    """The ranked kernels for an `attention_backend` value: the pinned kernel, then auto's order without it."""
    pinned = pinned_kernel(setting)
    if pinned is None:
        return list(AUTO_ORDER)
    return [pinned, *(kernel for kernel in AUTO_ORDER if kernel != pinned)]


def demoted_order(order: Sequence[SDPBackend]) -> tuple[SDPBackend, ...]:
    """cuDNN moved behind math, the kernel that serves every call: after a run-time failure no call reaches cuDNN
    again, and every kernel that was ahead of it stays ahead."""
    rest = [kernel for kernel in order if kernel != SDPBackend.CUDNN_ATTENTION]
    return (*rest, SDPBackend.CUDNN_ATTENTION)


@dataclass(frozen=True)
class Window:
    """A benchmarking window over PyTorch's flags: one kernel alone (exclusive), or that kernel ranked first.
    `source` names what opened it, for the reports (e.g. "INVOKE_KREA2_SDPA_BACKEND=cudnn")."""

    mode: str
    kernel: SDPBackend
    exclusive: bool
    source: str = ""


_FLAG_NAMES: dict[SDPBackend, str] = {
    SDPBackend.MATH: "math",
    SDPBackend.FLASH_ATTENTION: "flash",
    SDPBackend.EFFICIENT_ATTENTION: "mem_efficient",
    SDPBackend.CUDNN_ATTENTION: "cudnn",
    SDPBackend.OVERRIDEABLE: "overrideable",
}
ALL_KERNELS: frozenset[SDPBackend] = frozenset(_FLAG_NAMES)


@dataclass(frozen=True)
class KernelFlags:
    enabled: frozenset[SDPBackend]
    order: tuple[int, ...]


def read_flags() -> KernelFlags:
    enabled = frozenset(k for k, name in _FLAG_NAMES.items() if getattr(torch._C, f"_get_{name}_sdp_enabled")())
    return KernelFlags(enabled, tuple(torch._C._get_sdp_priority_order()))


def apply_flags(flags: KernelFlags) -> None:
    for kernel, name in _FLAG_NAMES.items():
        getattr(torch._C, f"_set_sdp_use_{name}")(kernel in flags.enabled)
    torch._C._set_sdp_priority_order(list(flags.order))


def ranked_flags(order: Sequence[SDPBackend], enabled: Iterable[SDPBackend] | None = None) -> KernelFlags:
    """Set-priority semantics: `order` first, then every other backend in PyTorch's current order.

    OVERRIDEABLE (the fused oneDNN kernel of XPU builds) stays enabled and goes after math: XPU ignores the order
    but honours the flags, so disabling it would send every XPU call to math, while CUDA walks the order and
    raises "Invalid backend" if it meets an enabled OVERRIDEABLE before math.
    """
    ranked = [int(k) for k in order]
    if int(SDPBackend.OVERRIDEABLE) not in ranked:
        ranked.append(int(SDPBackend.OVERRIDEABLE))
    ranked += [b for b in torch._C._get_sdp_priority_order() if b not in ranked]
    return KernelFlags(ALL_KERNELS if enabled is None else frozenset(enabled), tuple(ranked))


def flags_for(order: Sequence[SDPBackend], window: Window | None, cudnn_demoted: bool) -> KernelFlags:
    """The flags in force: the installed order, or an open window over it. A window never ranks a demoted cuDNN
    first again: that would send calls to the kernel that failed, with no fallback left around it."""
    if window is not None and window.exclusive:
        return ranked_flags([window.kernel], enabled=[window.kernel])
    ranked = list(order)
    if window is not None and not (window.kernel is SDPBackend.CUDNN_ATTENTION and cudnn_demoted):
        ranked = [window.kernel, *(k for k in ranked if k != window.kernel)]
    return ranked_flags(ranked)
