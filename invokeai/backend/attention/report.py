"""The report layer: "attention_backend '...' is not possible", once per (node type, pinned, serving, reason).

A pin is never exclusive: a call the pinned kernel cannot serve runs on the next kernel of the order, and the admin
is told why, once, instead of being left to guess which kernel ran (or being warned on every call). A call is
reported after it completed, so a call that raised is not reported as served. Only devices that walk the installed
order (CUDA, XPU) are reported: the CPU and MPS pick their kernel themselves, so a pin means nothing there.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend import devices
from invokeai.backend.attention import stats
from invokeai.backend.attention.caller import current_node_type
from invokeai.backend.attention.layer import Call, Layer, Rebuild, Route
from invokeai.backend.attention.policy import KERNEL_PHRASES
from invokeai.backend.attention.routing import ERROR, describe_call, route_name
from invokeai.backend.attention.state import AttentionState

logger = logging.getLogger(__name__)

CANNOT_SERVE = "cannot_serve"
UNAVAILABLE = "unavailable"
WINDOW = "window"

_CAN_USE: dict[str, Callable[..., bool]] = {
    "FLASH_ATTENTION": torch.backends.cuda.can_use_flash_attention,
    "EFFICIENT_ATTENTION": torch.backends.cuda.can_use_efficient_attention,
}
if hasattr(torch.backends.cuda, "can_use_cudnn_attention"):
    _CAN_USE["CUDNN_ATTENTION"] = torch.backends.cuda.can_use_cudnn_attention


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


class Report(Layer):
    name = "report"

    def active(self, state: AttentionState) -> bool:
        return state.pinned is not None and devices.has_reported_device()

    def reason_for(self, state: AttentionState, pinned: str, route: Route) -> tuple[str, str]:
        for layer in state.registry:
            found = layer.reason(state, pinned, route)
            if found is not None:
                return found
        window, served = state.window, route_name(route)
        if window is not None and served == window.kernel.name:
            if window.exclusive:
                return WINDOW, f"the exclusive {window.source} window switched it off"
            return WINDOW, f"the {window.source} window ranked {KERNEL_PHRASES[window.kernel]} above it"
        phrase = KERNEL_PHRASES[getattr(SDPBackend, pinned)]
        if pinned in state.unavailable:
            return UNAVAILABLE, f"this build or device has no {phrase.removeprefix('the ')}"
        return CANNOT_SERVE, f"{phrase} cannot serve this call"

    def wrap(self, state: AttentionState, inner: Call, rebuild: Rebuild) -> Call:
        assert state.pinned is not None
        pinned = state.pinned.name
        setting = state.setting
        # Kept in stats, not here: a rebuild (demotion, Sage switched off) makes a new layer but must not report
        # again. `handled` is this layer's: (node type, route, state version) already looked at, so the steady
        # state costs one set lookup, and any change of the state (a window, a demotion) looks again.
        seen = stats.reported_keys
        handled: set[tuple[str, Route, int]] = set()
        lock = threading.Lock()

        is_reported = devices.is_reported_tensor  # bound once: the hot path of every pinned call
        node_type = current_node_type

        def report(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
            out = inner(route, q, k, v, m, d, c, s, g)
            if route == pinned or route == ERROR:
                return out
            # Only reported tensors' keys are ever handled, so a handled key needs no device check.
            handled_key = (node_type(), route, state.version)
            if handled_key in handled or not is_reported(q):
                return out
            served = route_name(route)
            if served != pinned:  # a layer's own route may still run the pinned kernel (guarded math)
                reason, explanation = self.reason_for(state, pinned, route)
                key = (handled_key[0], pinned, served, reason)
                with lock:
                    first = key not in seen
                    seen.add(key)
                if first:
                    if reason == CANNOT_SERVE:
                        explanation += f" ({describe_call(q, k, m, d, c, g)})"
                    message = (
                        f"attention_backend {setting!r} is not possible for attention in {key[0]}: {explanation}; "
                        f"it runs on {served}."
                    )
                    logger.warning(message)
                    stats.reports.append(
                        stats.AttentionReport(
                            node_type=key[0], pinned=pinned, serving=served, reason=reason, message=message
                        )
                    )
                    if reason == CANNOT_SERVE:
                        _pytorch_reason(pinned, q, k, v, m, d, c, g)
            handled.add(handled_key)
            return out

        return report
