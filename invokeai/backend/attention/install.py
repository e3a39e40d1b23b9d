"""Process-wide installation: rank PyTorch's kernels, probe the device, and rebind SDPA with the layers needed."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from invokeai.backend.attention import devices, stats
from invokeai.backend.attention.caller import current_node_type
from invokeai.backend.attention.cudnn_fallback import cudnn_fallback_layer, log_demotion
from invokeai.backend.attention.kernels import KERNEL_PHRASES, check_setting, kernel_order, pinned_kernel
from invokeai.backend.attention.patch import public_function, rocm_math_layer, sage_layer, sdpa_layer
from invokeai.backend.attention.probe import probe_kernels, unavailable_kernels
from invokeai.backend.attention.report import report_layer
from invokeai.backend.attention.rocm_guard import MATH_CHUNK_BYTES, max_fused_head_dim
from invokeai.backend.attention.routing import make_router
from invokeai.backend.attention.sage import load_sage
from invokeai.backend.attention.state import STATE, WINDOW_ENV, AttentionState, demoted_order
from invokeai.backend.attention.torch_flags import apply_flags, read_flags

logger = logging.getLogger(__name__)


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def rebind(state: AttentionState = STATE) -> None:
    """Compose the layers the current state needs and put the result in place of SDPA."""
    assert state.original_sdpa is not None
    chain = sdpa_layer(state.original_sdpa)
    if state.sage is not None:
        chain = sage_layer(chain, state.sage, give_up_sage)
    if devices.has_cuda() and not state.cudnn_demoted and SDPBackend.CUDNN_ATTENTION in state.order:
        chain = cudnn_fallback_layer(chain, state, demote_cudnn)
    if state.rocm_max_head_dim is not None:
        chain = rocm_math_layer(chain, MATH_CHUNK_BYTES)
    if state.pinned is not None and devices.has_reported_device():
        chain = report_layer(chain, state, state.pinned)
    state.router = make_router(state)
    state.wrapper = public_function(state.router, chain, state.original_sdpa, state.lock if state.serialize else None)
    F.scaled_dot_product_attention = state.wrapper


def demote_cudnn(error: RuntimeError) -> None:
    with STATE.lock:
        if STATE.cudnn_demoted:
            return
        STATE.cudnn_demoted = True
        STATE.order = demoted_order(STATE.order)
        STATE.apply()
        log_demotion(error)
        rebind()


def give_up_sage(error: Exception) -> Callable[..., torch.Tensor]:
    """Sage failed at run time: auto's order serves every call from now on."""
    with STATE.lock:
        if STATE.sage is not None:
            logger.warning(
                "SageAttention failed in %s: %s. It is switched off for the rest of this process; attention "
                "runs on auto's order.",
                current_node_type(),
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
            )
            stats.events.append({"event": "sage_disabled", "node_type": current_node_type(), "error": str(error)})
            STATE.sage = None
            rebind()
        assert STATE.wrapper is not None
        return STATE.wrapper


def _startup_messages(device: torch.device) -> None:
    setting, pinned = STATE.setting, STATE.pinned
    if pinned is None:
        return
    if not devices.has_reported_device():
        logger.info(
            "attention_backend %r has no effect on %s: PyTorch picks the CPU kernel itself (flash, else math) and "
            "ignores the ranking; it applies to CUDA and XPU devices.",
            setting,
            device.type,
        )
        return
    if pinned.name in STATE.unavailable:
        logger.warning(
            "attention_backend %r: this build or device has no %s (%s); every call runs on the next kernel of %s.",
            setting,
            KERNEL_PHRASES[pinned].removeprefix("the "),
            device,
            ", ".join(k.name for k in STATE.order[1:]),
        )
    if pinned is SDPBackend.MATH:
        logger.warning(
            "attention_backend 'math' materialises the whole score matrix for every call: slow, and much more "
            "memory. It is meant for debugging. Only working-memory estimates that price attention through "
            "sdpa_score_matrix_bytes reserve that memory; anything else may run out of memory."
        )


def install_attention(setting: str, device: torch.device | str | None = None) -> None:
    """Rank PyTorch's SDPA kernels for `setting` and rebind SDPA, once per process (idempotent)."""
    check_setting(setting)
    target = torch.device(device) if device is not None else _default_device()
    with STATE.lock:
        if STATE.installed:
            if STATE.setting == setting and STATE.device == target:
                return
            uninstall_attention()
        stats.reset()
        STATE.original_sdpa = F.scaled_dot_product_attention
        STATE.previous_flags = read_flags()
        STATE.setting = setting
        STATE.pinned = pinned_kernel(setting)
        STATE.order = tuple(kernel_order(setting))
        STATE.cudnn_demoted = False
        STATE.window = None
        STATE.rocm_max_head_dim = max_fused_head_dim() if devices.is_rocm() else None
        STATE.serialize = bool(os.environ.get(WINDOW_ENV, "").strip())
        STATE.device = target
        STATE.probe = probe_kernels(target)
        STATE.unavailable = unavailable_kernels(STATE.probe)
        STATE.sage = load_sage() if setting == "sage" else None
        STATE.apply()
        rebind()
        _startup_messages(target)


def uninstall_attention() -> None:
    """Exact undo: the original SDPA function object and PyTorch's previous flags and order come back."""
    with STATE.lock:
        if not STATE.installed:
            return
        assert STATE.original_sdpa is not None and STATE.previous_flags is not None
        F.scaled_dot_product_attention = STATE.original_sdpa
        apply_flags(STATE.previous_flags)
        STATE.setting = None
        STATE.device = None
        STATE.probe = None
        STATE.unavailable = frozenset()
        STATE.pinned = None
        STATE.wrapper = None
        STATE.router = None
        STATE.window = None
        STATE.sage = None
        STATE.rocm_max_head_dim = None
        STATE.cudnn_demoted = False
        STATE.serialize = False
