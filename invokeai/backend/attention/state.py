"""The process-wide attention state: what is installed, what PyTorch's flags were, demotion and window."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend.attention.kernels import AUTO_ORDER
from invokeai.backend.attention.torch_flags import KernelFlags, apply_flags, ranked_flags

WINDOW_ENV = "INVOKE_KREA2_SDPA_BACKEND"


@dataclass(frozen=True)
class Window:
    """An INVOKE_KREA2_SDPA_BACKEND window: one kernel alone (exclusive) or that kernel ranked first."""

    mode: str
    kernel: SDPBackend
    exclusive: bool


@dataclass
class AttentionState:
    setting: str | None = None
    device: torch.device | None = None
    pinned: SDPBackend | None = None
    order: tuple[SDPBackend, ...] = AUTO_ORDER
    cudnn_demoted: bool = False
    window: Window | None = None
    original_sdpa: Callable[..., Any] | None = None
    wrapper: Callable[..., Any] | None = None
    router: Callable[..., Any] | None = None
    previous_flags: KernelFlags | None = None
    probe: dict[str, Any] | None = None
    unavailable: frozenset[str] = frozenset()
    sage: Any = None
    rocm_max_head_dim: int | None = None
    serialize: bool = False
    # Bumped whenever the flags change (install, demotion, window), so the report can skip re-deriving a reason.
    version: int = 0
    # Every attention call takes this lock while windows are possible, and a window holds it for its whole
    # generation: PyTorch's flags are process-global, so that is the only way a window cannot leak into another
    # thread's calls. Reentrant, so the window's own thread keeps calling attention inside it.
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def installed(self) -> bool:
        return self.wrapper is not None

    def effective_flags(self) -> KernelFlags:
        window = self.window
        if window is not None and window.exclusive:
            return ranked_flags([window.kernel], enabled=[window.kernel])
        order = list(self.order)
        if window is not None and not (window.kernel is SDPBackend.CUDNN_ATTENTION and self.cudnn_demoted):
            order = [window.kernel, *(k for k in order if k != window.kernel)]
        return ranked_flags(order)

    def apply(self) -> None:
        apply_flags(self.effective_flags())
        self.version += 1


def demoted_order(order: tuple[SDPBackend, ...]) -> tuple[SDPBackend, ...]:
    """cuDNN moved to just after the memory-efficient kernel (math stays the last resort)."""
    rest = [k for k in order if k != SDPBackend.CUDNN_ATTENTION]
    at = rest.index(SDPBackend.EFFICIENT_ATTENTION) + 1
    return (*rest[:at], SDPBackend.CUDNN_ATTENTION, *rest[at:])


STATE = AttentionState()
