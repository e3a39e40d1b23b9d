"""PyTorch's process-wide SDPA kernel flags and priority order: read, rank, apply.

`torch.nn.attention.sdpa_kernel(..., set_priority=True)` does the same on entry, but it is a context manager that
restores on exit; the server holds one order for the life of the process and changes it on a cuDNN demotion or an
exclusive window, so the same two steps (enable flags, then the priority order) are applied here directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend

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
