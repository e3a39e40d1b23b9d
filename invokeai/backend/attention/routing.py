"""Which kernel serves a call under the installed policy: the ROCm guard, then sage, then PyTorch's dispatcher.

The patch, `serving_kernel` and the memory pricing all ask the router built here, so what is counted, reported and
priced is what runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend.attention import devices
from invokeai.backend.attention.state import AttentionState

SAGE = "sage"


class _GuardedMath:
    """The math kernel, reached through the ROCm wide-head guard rather than through PyTorch's order."""

    name = "MATH"

    def __str__(self) -> str:
        return "MATH"

    def __repr__(self) -> str:
        return "GUARDED_MATH"


GUARDED_MATH = _GuardedMath()

Router = Callable[..., Any]


def make_router(state: AttentionState) -> Router:
    """A function (q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> route, with only the checks needed.

    PyTorch's dispatcher is asked on every call rather than through a cache: on this project's CPU a cache key
    (three shapes, dtype, device) costs more than the query itself (~0.65 us).
    """
    choice = devices.fused_sdp_choice
    by_value = devices.BACKEND_BY_VALUE

    def dispatcher_route(q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        try:
            # Explicit defaults cost the C binding ~0.3 us to parse, so the common call passes only the tensors.
            if s is None and not g:
                if m is None and not d and not c:
                    return by_value[choice(q, k, v)]
                return by_value[choice(q, k, v, m, d, c)]
            return by_value[choice(q, k, v, m, d, c, scale=s, enable_gqa=g)]
        except Exception:
            # Bad arguments or no eligible kernel: the real call raises PyTorch's own error, unchanged.
            return "ERROR"

    guard = state.rocm_max_head_dim
    sage = state.sage
    if guard is None and sage is None:
        return dispatcher_route

    def route(q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        try:
            if guard is not None and q.dim() >= 2 and q.shape[-1] > guard:
                return GUARDED_MATH
            if sage is not None and sage.takes(q, k, v, m, d, c, g):
                return SAGE
        except Exception:
            pass
        return dispatcher_route(q, k, v, m, d, c, s, g)

    return route


def public_kernel(route: Any) -> SDPBackend | str:
    """What `serving_kernel` answers: a PyTorch backend, or "sage"."""
    if route is SAGE:
        return SAGE
    return getattr(SDPBackend, str(route))


def describe_call(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
) -> str:
    """What a kernel's eligibility turns on: "bfloat16, head_dim 128, no mask, 32 query / 8 key-value heads"."""
    parts = [str(query.dtype).removeprefix("torch."), f"head_dim {query.shape[-1]}"]
    if attn_mask is None:
        parts.append("no mask")
    elif attn_mask.dtype == torch.bool:
        parts.append("bool mask")
    else:
        parts.append(f"additive {str(attn_mask.dtype).removeprefix('torch.')} mask")
    if query.dim() == 4:
        q_heads, kv_heads = query.shape[1], key.shape[1]
        parts.append(f"{q_heads} heads" if q_heads == kv_heads else f"{q_heads} query / {kv_heads} key-value heads")
        parts.append(f"query length {query.shape[2]}, key length {key.shape[2]}")
    else:
        parts.append(f"{query.dim()}-D input")
    if enable_gqa:
        parts.append("enable_gqa")
    if is_causal:
        parts.append("causal")
    if dropout_p:
        parts.append(f"dropout {dropout_p}")
    return ", ".join(parts)
