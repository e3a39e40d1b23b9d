"""The ROCm wide-head guard layer: heads wider than the fused kernels handle go to math, and big math calls run in
chunks.

On ROCm the fused kernels misbehave on very wide heads (a VAE's single 512-wide head), so such calls run the math
kernel through its aten op directly: never by toggling the process-global flags, which would leak into other
threads. Math materialises the whole score matrix; above MATH_CHUNK_BYTES it runs whole grouped-query groups of
heads, or query rows of one group when a group alone is too big, so the matrix held at any time stays bounded. The
result equals the unchunked call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from invokeai.backend.attention import stats
from invokeai.backend.attention.layer import Call, Claim, Layer, Rebuild, Route
from invokeai.backend.attention.memory import PricedCall, bytes_per_score_element, score_matrix_bytes
from invokeai.backend.attention.state import AttentionState

logger = logging.getLogger(__name__)

MAX_HEAD_DIM_ENV = "INVOKE_ROCM_FUSED_SDPA_MAX_HEAD_DIM"
DEFAULT_MAX_HEAD_DIM = 256
MATH_CHUNK_BYTES = 1 << 30
ROCM_GUARD = "rocm_guard"


class _GuardedMath:
    """The math kernel, reached through the guard rather than through PyTorch's order."""

    def __str__(self) -> str:
        return "MATH"

    def __repr__(self) -> str:
        return "GUARDED_MATH"


GUARDED_MATH = _GuardedMath()


def max_fused_head_dim() -> int:
    raw = os.environ.get(MAX_HEAD_DIM_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_HEAD_DIM
    try:
        value = int(raw)
        if value <= 0:
            raise ValueError(raw)
        return value
    except ValueError:
        logger.warning(
            "%s=%r is not a positive integer; using the default %d", MAX_HEAD_DIM_ENV, raw, DEFAULT_MAX_HEAD_DIM
        )
        return DEFAULT_MAX_HEAD_DIM


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool mask as the additive one SDPA's front end makes of it before any kernel (the aten ops do not)."""
    if mask is not None and mask.dtype == torch.bool:
        return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), float("-inf"))
    return mask


def _math(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, additive_mask(mask, q.dtype), dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


def _slice_heads(tensor: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    # A mask broadcasts from the right, so a 3-D one's first dimension is the heads too.
    if tensor is None or tensor.dim() < 3 or tensor.shape[-3] == 1:
        return tensor
    return tensor[..., start:stop, :, :]


def chunked_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    budget: int = MATH_CHUNK_BYTES,
) -> torch.Tensor:
    """The math kernel, split so that no piece materialises more than `budget` bytes of scores (where a piece of
    one query row of one group can stay under it)."""
    if q.dim() != 4 or k.dim() != 4 or (attn_mask is not None and is_causal):
        # Unchunked: 3-D calls, and a mask with is_causal, which the math op refuses with PyTorch's own error.
        return _math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    batch, q_heads, q_len, _ = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    per_row = batch * k_len * bytes_per_score_element(q.device, q.dtype)
    per_head = per_row * q_len
    if per_head * q_heads <= budget:
        return _math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if not (kv_heads in (1, q_heads) or (enable_gqa and q_heads % kv_heads == 0)):
        # Shapes SDPA rejects: let the unchunked call raise PyTorch's own error.
        return _math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    # A group is the query heads that share one key-value head; a chunk never splits one.
    group = q_heads // kv_heads if kv_heads not in (1, q_heads) else 1
    shared_kv = kv_heads == 1

    def kv(start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        if shared_kv:
            return k, v
        return k[:, start // group : stop // group], v[:, start // group : stop // group]

    if per_head * group <= budget:
        step = (budget // (per_head * group)) * group
        pieces = []
        for start in range(0, q_heads, step):
            stop = min(start + step, q_heads)
            k_part, v_part = kv(start, stop)
            mask = _slice_heads(attn_mask, start, stop)
            pieces.append(_math(q[:, start:stop], k_part, v_part, mask, dropout_p, is_causal, scale, enable_gqa))
        return torch.cat(pieces, dim=1)

    rows = max(1, budget // (per_row * group))
    groups = []
    for start in range(0, q_heads, group):
        stop = start + group
        k_part, v_part = kv(start, stop)
        mask = _slice_heads(attn_mask, start, stop)
        pieces = []
        for row in range(0, q_len, rows):
            row_stop = min(row + rows, q_len)
            if is_causal:
                # PyTorch's causal mask is aligned top-left: row r sees keys 0..r.
                positions = torch.arange(row, row_stop, device=q.device)[:, None]
                row_mask: torch.Tensor | None = torch.arange(k_len, device=q.device)[None, :] <= positions
            elif mask is not None and mask.dim() >= 2 and mask.shape[-2] != 1:
                row_mask = mask[..., row:row_stop, :]
            else:
                row_mask = mask
            pieces.append(
                _math(q[:, start:stop, row:row_stop], k_part, v_part, row_mask, dropout_p, False, scale, enable_gqa)
            )
        groups.append(torch.cat(pieces, dim=2))
    return torch.cat(groups, dim=1)


class RocmGuard(Layer):
    name = "rocm_guard"

    def active(self, state: AttentionState) -> bool:
        return state.rocm_max_head_dim is not None

    def claim(self, state: AttentionState) -> Claim | None:
        limit = state.rocm_max_head_dim

        def wide_head(q, k, v, m, d, c, g):  # type: ignore[no-untyped-def]
            return GUARDED_MATH if q.dim() >= 2 and q.shape[-1] > limit else None

        return wide_head

    def wrap(self, state: AttentionState, inner: Call, rebuild: Rebuild) -> Call:
        count = stats.count

        def guard(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
            if route is GUARDED_MATH or (
                route == "MATH"
                and q.dim() == 4
                and score_matrix_bytes(q.shape[0] * q.shape[1], q.shape[2], k.shape[-2], q.device, q.dtype)
                > MATH_CHUNK_BYTES
            ):
                out = chunked_math(q, k, v, m, d, c, s, g, MATH_CHUNK_BYTES)
                count(route)
                return out
            return inner(route, q, k, v, m, d, c, s, g)

        return guard

    def reason(self, state: AttentionState, pinned: str, route: Route) -> tuple[str, str] | None:
        if route is GUARDED_MATH:
            return ROCM_GUARD, (
                f"the ROCm wide-head guard sends calls with head_dim above {state.rocm_max_head_dim} to math"
            )
        return None

    def price(self, state: AttentionState, call: PricedCall, inner: Callable[[], int]) -> int:
        """Guarded and big math calls run in chunks: their scores are capped at one chunk's."""
        assert state.rocm_max_head_dim is not None
        if call.head_dim > state.rocm_max_head_dim:
            return call.chunked_math_bytes(MATH_CHUNK_BYTES)
        return call.chunked_math_bytes(MATH_CHUNK_BYTES) if inner() else 0
