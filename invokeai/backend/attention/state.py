"""The process-wide attention state: what is installed, what PyTorch's flags were, the demotion and the window."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend.attention.policy import AUTO_ORDER, KernelFlags, Ranking, Window, apply_flags, flags_for

if TYPE_CHECKING:
    from invokeai.backend.attention.autotune import Tuner
    from invokeai.backend.attention.kernel_probe import KernelProbe
    from invokeai.backend.attention.layer import Layer
    from invokeai.backend.attention.sage import SageKernel


@dataclass
class AttentionState:
    setting: str | None = None
    device: torch.device | None = None
    pinned: SDPBackend | None = None
    order: tuple[SDPBackend, ...] = AUTO_ORDER
    # The order the install ranked for its device, with the reason (`order` changes on a demotion; this does not).
    ranking: Ranking | None = None
    # Whether the cuDNN guard applies to this device (sm100 family, a torch without the fix).
    cudnn_guarded: bool = False
    cudnn_demoted: bool = False
    window: Window | None = None
    original_sdpa: Callable[..., torch.Tensor] | None = None
    # The function in place of SDPA, the router it asks and the layers it is composed of.
    public: Callable[..., torch.Tensor] | None = None
    router: Callable[..., Any] | None = None
    layers: tuple[Layer, ...] = ()
    # Every registered layer, composed or not: any of them may be the reason a pinned kernel did not serve a call.
    registry: tuple[Layer, ...] = ()
    previous_flags: KernelFlags | None = None
    probe: KernelProbe | None = None
    unavailable: frozenset[str] = frozenset()
    sage: SageKernel | None = None
    rocm_max_head_dim: int | None = None
    # Counts installs, so that a window closing after an uninstall or a re-install leaves their flags alone.
    installation: int = 0
    # Bumped whenever the flags change (install, demotion, window), so the report can skip re-deriving a reason.
    version: int = 0
    # From the first window on, every attention call takes `lock`, and a window holds it for its whole generation:
    # PyTorch's flags are process-global, so that is the only way a window cannot leak into another thread's calls.
    # Reentrant, so the window's own thread keeps calling attention inside it.
    serialize: bool = False
    # Set once the first window's wait for the calls already in flight is over; other windows wait for it.
    draining: threading.Event | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    # Measured autotuning (attention_autotune): off, on, or pinned (asked for, but a pin overrides it); the tuner
    # holds the tuned choices while it is on.
    autotune: str = "off"
    tuner: Tuner | None = None

    @property
    def installed(self) -> bool:
        return self.public is not None

    def apply(self) -> None:
        apply_flags(flags_for(self.order, self.window, self.cudnn_demoted))
        self.version += 1


STATE = AttentionState()
