"""The function that replaces `torch.nn.functional.scaled_dot_product_attention`, and its innermost layer.

Layers share one internal signature, (route, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa), so the
route is computed once per call. A layer only exists where its condition holds; the composition is in install.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from invokeai.backend.attention import stats
from invokeai.backend.attention.caller import current_node_type
from invokeai.backend.attention.cudnn_fallback import is_out_of_memory
from invokeai.backend.attention.rocm_guard import chunked_math
from invokeai.backend.attention.routing import GUARDED_MATH, SAGE
from invokeai.backend.attention.score_matrix import score_matrix_bytes

Layer = Callable[..., Any]


def sdpa_layer(original: Callable[..., torch.Tensor]) -> Layer:
    """PyTorch's SDPA, called with the arguments the caller gave (so its errors are PyTorch's own)."""
    local = stats.thread_local
    new_counts = stats.counts_for_this_thread
    node_type = current_node_type

    def sdpa(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        # Parsing explicit defaults costs the C binding ~0.3 us, so the common call passes only the tensors.
        if s is None and not g:
            out = original(q, k, v) if m is None and not d and not c else original(q, k, v, m, d, c)
        else:
            out = original(q, k, v, m, d, c, scale=s, enable_gqa=g)
        # stats.count, inlined: this is the hottest line of the server.
        try:
            counts = local.counts
        except AttributeError:
            counts = new_counts()
        key = (node_type(), route)
        counts[key] = counts.get(key, 0) + 1
        return out

    return sdpa


def sage_layer(inner: Layer, sage: Any, give_up: Callable[[Exception], Callable[..., torch.Tensor]]) -> Layer:
    """Calls routed to Sage run there; if Sage fails at run time (a Triton build error, an unsupported GPU),
    `give_up` turns it off for the process and returns the rebuilt SDPA, which runs the call on auto's order."""
    count = stats.count

    def sage_call(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        if route is SAGE:
            try:
                out = sage(q, k, v, c, s)
            except Exception as error:
                if is_out_of_memory(error):
                    raise
                return give_up(error)(q, k, v, m, d, c, scale=s, enable_gqa=g)
            count(SAGE)
            return out
        return inner(route, q, k, v, m, d, c, s, g)

    return sage_call


def rocm_math_layer(inner: Layer, budget: int) -> Layer:
    """Math calls the guard sent, and math calls whose score matrix exceeds `budget`, run chunked via aten."""
    count = stats.count

    def rocm_math(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        if route is GUARDED_MATH or (
            route == "MATH"
            and q.dim() == 4
            and score_matrix_bytes(q.shape[0] * q.shape[1], q.shape[2], k.shape[-2], q.device, q.dtype) > budget
        ):
            out = chunked_math(q, k, v, m, d, c, s, g, budget)
            count(route)
            return out
        return inner(route, q, k, v, m, d, c, s, g)

    return rocm_math


def public_function(
    router: Callable[..., Any], chain: Layer, original: Callable[..., torch.Tensor], lock: threading.RLock | None
) -> Callable[..., torch.Tensor]:
    """A function with SDPA's exact signature (scale and enable_gqa are keyword-only, as in PyTorch)."""

    def scaled_dot_product_attention(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
    ):  # type: ignore[no-untyped-def]
        return chain(
            router(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa),
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
        )

    if lock is not None:
        unlocked = scaled_dot_product_attention

        def scaled_dot_product_attention(
            query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
        ):  # type: ignore[no-untyped-def]
            with lock:
                return unlocked(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    scaled_dot_product_attention.__doc__ = original.__doc__
    # Python names the qualified name in argument errors; keep them reading like PyTorch's.
    scaled_dot_product_attention.__qualname__ = "scaled_dot_product_attention"
    return scaled_dot_product_attention
