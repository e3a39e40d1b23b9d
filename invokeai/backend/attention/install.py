"""Process-wide installation: rank PyTorch's kernels, probe the device, and put SDPA's replacement in place, composed
of the registered layers whose condition holds."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from invokeai.backend import devices
from invokeai.backend.attention import cudnn_guard, stats
from invokeai.backend.attention.autotune import Autotune, Tuner
from invokeai.backend.attention.cudnn_fallback import CudnnFallback
from invokeai.backend.attention.cudnn_guard import CudnnGuard
from invokeai.backend.attention.kernel_probe import probe_kernels, unavailable_kernels
from invokeai.backend.attention.layer import Layer
from invokeai.backend.attention.patch import public_function, sdpa_call
from invokeai.backend.attention.policy import (
    KERNEL_PHRASES,
    apply_flags,
    pinned_kernel,
    ranking,
    read_flags,
    settle_pytorch_order,
)
from invokeai.backend.attention.report import Report
from invokeai.backend.attention.rocm_guard import RocmGuard, max_fused_head_dim
from invokeai.backend.attention.routing import make_router
from invokeai.backend.attention.sage import Sage, load_sage
from invokeai.backend.attention.settings import check_setting
from invokeai.backend.attention.state import STATE, AttentionState

logger = logging.getLogger(__name__)

# Outermost first. The fallback is outside the report, so a cuDNN call that fails is not reported as served and its
# retry (through the rebuilt SDPA) is reported with the demotion as its reason; the report is outside the guards and
# Sage, so it sees the calls they serve (the cuDNN guard reports its own first, under the key the report would use).
# Routes are asked in the same order (the ROCm guard before Sage). The autotuner comes last: its reroute is asked
# only for calls no other layer took or rerouted, and it leaves alone the kernels another layer keeps from a call.
LAYERS: tuple[Layer, ...] = (CudnnFallback(), Report(), CudnnGuard(), RocmGuard(), Sage(), Autotune())


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def rebind(state: AttentionState = STATE) -> Callable[..., torch.Tensor]:
    """Compose the layers the current state needs and put the result in place of SDPA; returns it."""
    assert state.original_sdpa is not None
    with state.lock:
        state.registry = LAYERS
        state.layers = tuple(layer for layer in LAYERS if layer.active(state))
        chain = sdpa_call(state.original_sdpa)
        for layer in reversed(state.layers):
            chain = layer.wrap(state, chain, lambda: rebind(state))
        state.router = make_router(state)
        state.public = public_function(state, state.router, chain, state.original_sdpa)
        F.scaled_dot_product_attention = state.public
        return state.public


def _startup_messages(state: AttentionState) -> None:
    setting, pinned, device = state.setting, state.pinned, state.device
    if state.ranking is not None:
        logger.info(
            "attention_backend %r on %s: kernels ranked %s. Why: %s.%s",
            setting,
            device,
            ", ".join(kernel.name for kernel in state.ranking.order),
            state.ranking.reason,
            " The cuDNN guard is on." if state.cudnn_guarded else "",
        )
    if pinned is None or device is None:
        return
    if not devices.has_reported_device():
        logger.info(
            "attention_backend %r has no effect on %s: PyTorch picks the CPU kernel itself (flash, else math) and "
            "ignores the ranking; it applies to CUDA and XPU devices.",
            setting,
            device.type,
        )
        return
    if pinned.name in state.unavailable:
        logger.warning(
            "attention_backend %r: this build or device has no %s (%s); every call runs on the next kernel of %s.",
            setting,
            KERNEL_PHRASES[pinned].removeprefix("the "),
            device,
            ", ".join(k.name for k in state.order[1:]),
        )
    if pinned is SDPBackend.MATH:
        logger.warning(
            "attention_backend 'math' materialises the whole score matrix for every call: slow, and much more "
            "memory. It is meant for debugging. Only working-memory estimates that price attention through "
            "sdpa_score_matrix_bytes reserve that memory; anything else may run out of memory."
        )


def _autotune_messages(state: AttentionState) -> None:
    if state.autotune == "pinned":
        logger.info(
            "attention_autotune 'on' has no effect: attention_backend %r pins a kernel, and a pin overrides tuning.",
            state.setting,
        )
    elif state.tuner is not None:
        logger.info(
            "attention_autotune 'on': the first call of each shape bucket times the kernels that can serve it "
            "(at most %g ms a bucket); choices are kept in %s.",
            state.tuner.budget_ms,
            state.tuner.path or "memory only",
        )


def install_attention(
    setting: str,
    device: torch.device | str | None = None,
    *,
    autotune: bool = False,
    autotune_file: str | Path | None = None,
) -> None:
    """Rank PyTorch's SDPA kernels for `setting` and replace SDPA, once per process: a second call with the same
    setting, device (however it is spelled: "cuda" is "cuda:0" where that is the current device) and tuning does
    nothing; anything else installs again, probing that device.

    `autotune`: time the kernels on each shape bucket's first call and rank the fastest first for the bucket
    (autotune.py), keeping the choices in `autotune_file` (None: in memory only). A pin overrides it."""
    check_setting(setting)
    target = devices.canonical_device(device if device is not None else _default_device())
    tuning_path = Path(autotune_file) if autotune_file is not None else None
    with STATE.lock:
        if STATE.installed:
            tuned_as_asked = (STATE.autotune != "off") == autotune and (
                not autotune or STATE.tuner is None or STATE.tuner.path == tuning_path
            )
            if STATE.setting == setting and STATE.device == target and tuned_as_asked:
                return
            uninstall_attention()
        stats.reset()
        STATE.installation += 1
        STATE.original_sdpa = F.scaled_dot_product_attention
        settle_pytorch_order(target)
        STATE.previous_flags = read_flags()
        STATE.setting = setting
        STATE.pinned = pinned_kernel(setting)
        STATE.ranking = ranking(setting, device=target)
        STATE.order = STATE.ranking.order
        STATE.cudnn_guarded = cudnn_guard.needed(STATE.ranking.facts)
        STATE.cudnn_demoted = False
        STATE.window = None
        STATE.serialize = False
        STATE.draining = None
        STATE.rocm_max_head_dim = max_fused_head_dim() if devices.is_rocm() else None
        STATE.device = target
        STATE.probe = probe_kernels(target)
        STATE.unavailable = unavailable_kernels(STATE.probe)
        STATE.sage = load_sage() if setting == "sage" else None
        STATE.autotune = "off" if not autotune else "pinned" if STATE.pinned is not None else "on"
        STATE.tuner = Tuner(STATE, tuning_path) if STATE.autotune == "on" else None
        STATE.apply()
        rebind()
        _startup_messages(STATE)
        _autotune_messages(STATE)


def uninstall_attention() -> None:
    """Exact undo: the original SDPA function object and PyTorch's previous flags and order come back, also inside
    an open window (which then leaves them alone when it closes)."""
    with STATE.lock:
        if not STATE.installed:
            return
        assert STATE.original_sdpa is not None and STATE.previous_flags is not None
        F.scaled_dot_product_attention = STATE.original_sdpa
        apply_flags(STATE.previous_flags)
        STATE.installation += 1
        STATE.setting = None
        STATE.device = None
        STATE.probe = None
        STATE.unavailable = frozenset()
        STATE.pinned = None
        STATE.ranking = None
        STATE.cudnn_guarded = False
        STATE.public = None
        STATE.router = None
        STATE.layers = ()
        STATE.window = None
        STATE.sage = None
        STATE.rocm_max_head_dim = None
        STATE.cudnn_demoted = False
        STATE.serialize = False
        STATE.draining = None
        STATE.autotune = "off"
        STATE.tuner = None
