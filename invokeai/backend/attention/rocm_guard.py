"""ROCm wide-head guard: heads wider than the fused kernels handle go to math, and big math calls run in chunks.

On ROCm the fused kernels misbehave on very wide heads (a VAE's single 512-wide head), so such calls run the
math kernel through its aten op directly: never by toggling the process-global flags, which would leak into other
threads. Math materialises the whole score matrix; above MATH_CHUNK_BYTES it runs head groups, or query rows when
one head alone is too big, so the matrix held at any time stays bounded. The result equals the unchunked call.
"""

from __future__ import annotations

import logging
import os

import torch

from invokeai.backend.attention.score_matrix import bytes_per_score_element

logger = logging.getLogger(__name__)

MAX_HEAD_DIM_ENV = "INVOKE_ROCM_FUSED_SDPA_MAX_HEAD_DIM"
DEFAULT_MAX_HEAD_DIM = 256
MATH_CHUNK_BYTES = 1 << 30


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


def _math(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:  # type: ignore[no-untyped-def]
    if mask is not None and mask.dtype == torch.bool:
        # SDPA's front end turns a bool mask into an additive one before any kernel; the aten op does not.
        mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill_(mask.logical_not(), float("-inf"))
    return torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


def _heads_per_chunk(fitting: int, group: int) -> int:
    """Query heads per chunk so that a chunk never splits a grouped-query group across two key-value heads."""
    if fitting >= group:
        return fitting - fitting % group
    return max(d for d in range(1, group + 1) if group % d == 0 and d <= fitting)


def _slice_heads(tensor: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    if tensor is None or tensor.dim() < 4 or tensor.shape[-3] == 1:
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
    """The math kernel, split so that no piece materialises more than `budget` bytes of scores."""
    if q.dim() != 4 or k.dim() != 4:
        return _math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    batch, q_heads, q_len, _ = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    per_head = batch * q_len * k_len * bytes_per_score_element(q.device, q.dtype)
    if per_head * q_heads <= budget:
        return _math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if not (kv_heads in (1, q_heads) or (enable_gqa and q_heads % kv_heads == 0)):
        # Shapes SDPA rejects: let the unchunked call raise PyTorch's own error.
        return _math(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    group = q_heads // kv_heads if kv_heads not in (1, q_heads) else 1
    shared_kv = kv_heads == 1

    def kv(start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        if shared_kv:
            return k, v
        return k[:, start // group : (stop - 1) // group + 1], v[:, start // group : (stop - 1) // group + 1]

    if per_head <= budget:
        step = _heads_per_chunk(budget // per_head, group)
        pieces = []
        for start in range(0, q_heads, step):
            stop = min(start + step, q_heads)
            k_part, v_part = kv(start, stop)
            pieces.append(
                _math(
                    q[:, start:stop],
                    k_part,
                    v_part,
                    _slice_heads(attn_mask, start, stop),
                    dropout_p,
                    is_causal,
                    scale,
                    enable_gqa,
                )
            )
        return torch.cat(pieces, dim=1)

    rows = max(1, budget // (batch * k_len * bytes_per_score_element(q.device, q.dtype)))
    heads = []
    for head in range(q_heads):
        k_part, v_part = kv(head, head + 1)
        mask = _slice_heads(attn_mask, head, head + 1)
        pieces = []
        for start in range(0, q_len, rows):
            stop = min(start + rows, q_len)
            if is_causal:
                # PyTorch's causal mask is aligned top-left: row r sees keys 0..r.
                positions = torch.arange(start, stop, device=q.device)[:, None]
                row_mask: torch.Tensor | None = torch.arange(k_len, device=q.device)[None, :] <= positions
            elif mask is not None and mask.dim() >= 2 and mask.shape[-2] != 1:
                row_mask = mask[..., start:stop, :]
            else:
                row_mask = mask
            pieces.append(
                _math(q[:, head : head + 1, start:stop], k_part, v_part, row_mask, dropout_p, False, scale, False)
            )
        heads.append(torch.cat(pieces, dim=2))
    return torch.cat(heads, dim=1)
