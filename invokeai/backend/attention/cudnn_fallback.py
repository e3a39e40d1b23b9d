"""cuDNN fallback: a runtime failure of a cuDNN-served call demotes cuDNN for the process and retries the call.

cuDNN attention fails on some card/driver/version combinations with errors ("No execution plans support the
graph", CUDNN_STATUS_BAD_PARAM, internal asserts) that no eligibility check predicts. One failure moves cuDNN
behind the memory-efficient kernel for the rest of the process, so later calls pay no retry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from invokeai.backend.attention import stats
from invokeai.backend.attention.caller import current_node_type
from invokeai.backend.attention.state import AttentionState

logger = logging.getLogger(__name__)

_OUT_OF_MEMORY: type[BaseException] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, _OUT_OF_MEMORY) or "out of memory" in str(error).lower()


def cudnn_fallback_layer(
    inner: Callable[..., Any], state: AttentionState, demote: Callable[[RuntimeError], None]
) -> Callable[..., Any]:
    def fallback(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        if route != "CUDNN_ATTENTION":
            return inner(route, q, k, v, m, d, c, s, g)
        try:
            return inner(route, q, k, v, m, d, c, s, g)
        except RuntimeError as error:
            # An exclusive window exists to prove cuDNN served the run: it must fail visibly, not fall back.
            if is_out_of_memory(error) or (state.window is not None and state.window.exclusive):
                raise
            demote(error)
            assert state.wrapper is not None
            return state.wrapper(q, k, v, m, d, c, scale=s, enable_gqa=g)

    return fallback


def log_demotion(error: RuntimeError) -> None:
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    message = (
        f"cuDNN attention failed in {current_node_type()}: {first_line}. cuDNN is ranked after the "
        "memory-efficient kernel for the rest of this process, and the call is retried."
    )
    logger.warning(message)
    stats.events.append({"event": "cudnn_demoted", "node_type": current_node_type(), "error": first_line})
