"""The "pinned kernel not possible" report: once per (node type, pinned kernel, serving kernel, reason).

A pin is never exclusive: a call the pinned kernel cannot serve runs on the next kernel of the order, and the admin
is told why, once, instead of being left to guess which kernel ran (or being warned on every call).
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend.attention import devices, stats
from invokeai.backend.attention.caller import current_node_type
from invokeai.backend.attention.kernels import KERNEL_PHRASES
from invokeai.backend.attention.routing import GUARDED_MATH, describe_call
from invokeai.backend.attention.state import WINDOW_ENV, AttentionState

logger = logging.getLogger(__name__)

CANNOT_SERVE = "cannot_serve"
UNAVAILABLE = "unavailable"
DEMOTED = "demoted"
WINDOW = "window"
ROCM_GUARD = "rocm_guard"
REASONS = (CANNOT_SERVE, UNAVAILABLE, DEMOTED, WINDOW, ROCM_GUARD)

_CAN_USE: dict[str, Callable[..., bool]] = {
    "FLASH_ATTENTION": torch.backends.cuda.can_use_flash_attention,
    "EFFICIENT_ATTENTION": torch.backends.cuda.can_use_efficient_attention,
}
if hasattr(torch.backends.cuda, "can_use_cudnn_attention"):
    _CAN_USE["CUDNN_ATTENTION"] = torch.backends.cuda.can_use_cudnn_attention


def reason_for(state: AttentionState, pinned: str, route: Any) -> str:
    if route is GUARDED_MATH:
        return ROCM_GUARD
    if state.window is not None and state.window.exclusive:
        return WINDOW
    if pinned == "CUDNN_ATTENTION" and state.cudnn_demoted:
        return DEMOTED
    if pinned in state.unavailable:
        return UNAVAILABLE
    return CANNOT_SERVE


def _explain(state: AttentionState, pinned: str, reason: str, call_description: str, head_dim: int) -> str:
    phrase = KERNEL_PHRASES[getattr(SDPBackend, pinned)]
    if reason == ROCM_GUARD:
        return f"the ROCm wide-head guard sent this call (head_dim {head_dim} > {state.rocm_max_head_dim}) to math"
    if reason == WINDOW:
        assert state.window is not None
        return f"an exclusive {WINDOW_ENV}={state.window.mode} window switched it off"
    if reason == DEMOTED:
        return "the cuDNN kernel was demoted after a runtime failure earlier in this process"
    if reason == UNAVAILABLE:
        return f"this build or device has no {phrase.removeprefix('the ')}"
    return f"{phrase} cannot serve this call ({call_description})"


def _pytorch_reason(pinned: str, q, k, v, m, d, c, g) -> None:  # type: ignore[no-untyped-def]
    """PyTorch's own eligibility checks in debug mode, written once to stderr."""
    can_use = _CAN_USE.get(pinned)
    if can_use is None:
        return
    try:
        params = torch.backends.cuda.SDPAParams(q, k, v, m, d, c, g)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            can_use(params, True)
        lines = [str(w.message) for w in caught]
    except Exception as error:  # a diagnostic must never fail the call
        lines = [f"(PyTorch could not say: {error})"]
    if lines:
        sys.stderr.write(f"PyTorch on why {pinned} did not serve it:\n" + "\n".join(lines) + "\n")


def report_layer(inner: Callable[..., Any], state: AttentionState, pinned: SDPBackend) -> Callable[..., Any]:
    # Kept in stats, not here: a rebind (demotion, first window) builds a new layer but must not report again.
    seen = stats.reported_keys
    # (node type, route, state version) already handled: the steady state costs one set lookup.
    handled: set[tuple[str, Any, int]] = set()
    lock = threading.Lock()
    setting = state.setting
    pinned_name = pinned.name

    def report(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        if route != pinned_name and route != "ERROR" and devices.is_reported_tensor(q):
            fast_key = (current_node_type(), route, state.version)
            if fast_key in handled:
                return inner(route, q, k, v, m, d, c, s, g)
            reason = reason_for(state, pinned_name, route)
            key = (fast_key[0], route, reason)
            if key not in seen:
                with lock:
                    first = key not in seen
                    seen.add(key)
                if first:
                    message = (
                        f"attention_backend {setting!r} is not possible for attention in {key[0]}: "
                        f"{_explain(state, pinned_name, reason, describe_call(q, k, m, d, c, g), q.shape[-1])}; "
                        f"it runs on {stats.route_name(route)}."
                    )
                    logger.warning(message)
                    stats.reports.append(
                        {
                            "node_type": key[0],
                            "pinned": pinned_name,
                            "serving": stats.route_name(route),
                            "reason": reason,
                            "message": message,
                        }
                    )
                    if reason == CANNOT_SERVE:
                        _pytorch_reason(pinned_name, q, k, v, m, d, c, g)
            # Not for the ROCm guard: whether it applies depends on the call's head_dim, not on the state.
            if route is not GUARDED_MATH:
                handled.add(fast_key)
        return inner(route, q, k, v, m, d, c, s, g)

    return report
