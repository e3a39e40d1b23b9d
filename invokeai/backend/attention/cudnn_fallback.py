"""The cuDNN fallback layer: a run-time failure of a cuDNN-served call demotes cuDNN and retries the call.

cuDNN attention fails on some card, driver and version combinations with errors no eligibility check predicts
("No execution plans support the graph", CUDNN_STATUS_BAD_PARAM, internal asserts). One failure moves cuDNN behind
math for the rest of the process (`policy.demoted_order`), so no later call, and not the retry, reaches it again:
the retry runs on the next kernel that can serve it, or on math. With cuDNN out of reach the layer has nothing left
to catch, so the rebuilt SDPA no longer has it, and a second failure cannot recurse.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from invokeai.backend import devices
from invokeai.backend.attention import stats
from invokeai.backend.attention.caller import current_node_type
from invokeai.backend.attention.layer import Call, Layer, Rebuild, Route, is_out_of_memory
from invokeai.backend.attention.policy import demoted_order
from invokeai.backend.attention.state import AttentionState

logger = logging.getLogger(__name__)

CUDNN = "CUDNN_ATTENTION"
DEMOTED = "demoted"


def demote_cudnn(
    state: AttentionState, error: RuntimeError, rebuild: Rebuild, installation: int
) -> Callable[..., torch.Tensor]:
    """Rank cuDNN behind math for the rest of the process, once; returns the SDPA to retry with.

    `installation` is the install the failed call ran under. If it was uninstalled (or replaced) while the call
    ran, its order is not there to demote, and rebuilding would put a patched SDPA back after an exact undo: the
    call is retried on whatever SDPA is in place now.
    """
    with state.lock:
        if state.installation != installation:
            return F.scaled_dot_product_attention
        if not state.cudnn_demoted:
            state.cudnn_demoted = True
            state.order = demoted_order(state.order)
            state.apply()
            first_line = stats.record_event("cudnn_demoted", error)
            logger.warning(
                "cuDNN attention failed in %s: %s. cuDNN is ranked after math for the rest of this process (no "
                "call runs on it), and the call is retried on the next kernel.",
                current_node_type(),
                first_line,
            )
            return rebuild()
        assert state.public is not None
        return state.public


class CudnnFallback(Layer):
    name = "cudnn_fallback"

    def active(self, state: AttentionState) -> bool:
        return devices.has_cuda() and not state.cudnn_demoted

    def wrap(self, state: AttentionState, inner: Call, rebuild: Rebuild) -> Call:
        installation = state.installation

        def fallback(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
            if route != CUDNN:
                return inner(route, q, k, v, m, d, c, s, g)
            try:
                return inner(route, q, k, v, m, d, c, s, g)
            except RuntimeError as error:
                # An exclusive window exists to prove cuDNN served the run: it must fail visibly, not fall back.
                if is_out_of_memory(error) or (state.window is not None and state.window.exclusive):
                    raise
                retry = demote_cudnn(state, error, rebuild, installation)
            return retry(q, k, v, m, d, c, scale=s, enable_gqa=g)

        return fallback

    def reason(self, state: AttentionState, pinned: str, route: Route) -> tuple[str, str] | None:
        if pinned == CUDNN and state.cudnn_demoted:
            return DEMOTED, "the cuDNN kernel was demoted after a run-time failure earlier in this process"
        return None
