"""`sdpa_score_matrix_bytes`: what one attention call spends on a materialised score matrix, as the dispatcher says.

The model cache's working-memory estimators call this for every attention call they price, so a pinned math
kernel (or any call that falls to math) is reserved for instead of running out of memory silently.
"""

from __future__ import annotations

import torch

from invokeai.backend.attention.rocm_guard import MATH_CHUNK_BYTES
from invokeai.backend.attention.routing import GUARDED_MATH, SAGE, make_router
from invokeai.backend.attention.score_matrix import causal_mask_bytes, score_matrix_bytes
from invokeai.backend.attention.state import STATE

_PROBE_LEN = 64
_MATERIALISING = ("MATH", "ERROR", GUARDED_MATH)


def _probe_route(device: torch.device, dtype: torch.dtype, head_dim: int, has_attn_mask: bool, is_causal: bool):  # type: ignore[no-untyped-def]
    """Ask the installed router about a tiny call of the same device, dtype, head_dim and mask."""
    router = STATE.router if STATE.router is not None else make_router(STATE)
    q = torch.zeros(1, 1, _PROBE_LEN, head_dim, device=device, dtype=dtype)
    mask = torch.zeros(1, 1, _PROBE_LEN, _PROBE_LEN, device=device, dtype=dtype) if has_attn_mask else None
    return router(q, q, q, mask, 0.0, is_causal and not has_attn_mask, None, False)


def sdpa_score_matrix_bytes(
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    num_heads: int,
    query_len: int,
    key_len: int,
    head_dim: int,
    has_attn_mask: bool = False,
    is_causal: bool = False,
) -> int:
    """Bytes of score matrix one call materialises: 0 on a fused kernel, else heads x query_len x key_len x bytes
    per element, plus the causal mask for causal calls (capped per chunk where the ROCm guard chunks). Pass
    batch x heads as `num_heads`.

    MPS, and any failure of the probe, count as materialising: the conservative answer.
    """
    device = torch.device(device)
    full = score_matrix_bytes(num_heads, query_len, key_len, device, dtype)
    if is_causal and not has_attn_mask:
        full += causal_mask_bytes(query_len, key_len, dtype)
    if device.type == "mps":
        return full
    sage = STATE.sage
    if (
        sage is not None
        and device.type == "cuda"
        and not has_attn_mask
        and sage.fits(dtype, head_dim, 1, 1, query_len, key_len, is_causal, False)
    ):
        return 0
    try:
        route = _probe_route(device, dtype, head_dim, has_attn_mask, is_causal)
    except Exception:
        return full
    if route is SAGE or route not in _MATERIALISING:
        return 0
    if STATE.rocm_max_head_dim is not None:
        return min(full, MATH_CHUNK_BYTES)
    return full
