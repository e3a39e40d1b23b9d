"""`sdpa_score_matrix_bytes`: what one attention call materialises, priced on the kernel that will serve it.

The model cache's working-memory estimators call it for every attention call they price, so a pinned math kernel
(or any call that falls to math) is reserved for instead of running out of memory silently. It asks the same router
the patch uses, about a small call of the priced call's device, dtype, head layout, mask and causal flag, and the
composed layers' pricing rules come first, as their routes do for a real call (Sage takes long unmasked calls the
small probe call would not show it; the ROCm guard chunks what runs on math).

Bytes per score element are upper bounds of what `scripts/calibrate_sdpa_math_memory.py` measured on this
project's CI machine (torch 2.13.0, peak-RSS growth per score element, maxima over 8-head calls with no, additive
and causal masks and a one-head 512-wide VAE-like call): float32 9.9, bfloat16 11.4, float16 11.4, each rounded up
plus one byte of margin. A causal call also builds its mask once, shared by the heads (`causal_mask_bytes`), and
math works on copies of its operands and writes its result (`operand_bytes`), which short calls with wide heads are
made of more than of scores: a text encoder's [32 query / 8 key-value heads, 77x77, head_dim 128] fp32 call grows
by about 6.5 MiB, of which its scores are 0.7 MiB. The script sets every price against its measured growth: on the
CPU 1.1-1.35 times it for 77-token calls, 1.24-1.46 for long ones. Accelerator figures are the upper bound measured
on CUDA and ROCm in the design discussion (~17 bytes per element), used until the calibration is run on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from invokeai.backend.attention.routing import ERROR, make_router, route_name
from invokeai.backend.attention.state import STATE

CPU_BYTES_PER_SCORE_ELEMENT: dict[torch.dtype, int] = {
    torch.float32: 11,
    torch.bfloat16: 13,
    torch.float16: 13,
}
ACCELERATOR_BYTES_PER_SCORE_ELEMENT = 17
_PROBE_LEN = 64
_UPCAST = (torch.float16, torch.bfloat16)
_MATERIALISING = ("MATH", ERROR)


def bytes_per_score_element(device: torch.device | str, dtype: torch.dtype) -> int:
    if torch.device(device).type == "cpu":
        return CPU_BYTES_PER_SCORE_ELEMENT.get(dtype, 2 * dtype.itemsize + 8)
    return ACCELERATOR_BYTES_PER_SCORE_ELEMENT


def score_matrix_bytes(
    num_heads: int, query_len: int, key_len: int, device: torch.device | str, dtype: torch.dtype
) -> int:
    return num_heads * query_len * key_len * bytes_per_score_element(device, dtype)


def causal_mask_bytes(query_len: int, key_len: int, dtype: torch.dtype) -> int:
    """The math kernel's causal mask: one query_len x key_len additive bias and two bool temporaries per call,
    shared by every head (which is why one-head causal calls measure ~3 bytes per element above the table)."""
    return query_len * key_len * (dtype.itemsize + 2)


@dataclass(frozen=True)
class PricedCall:
    """One attention call as an estimator describes it; heads include the batch (batch x heads)."""

    device: torch.device
    dtype: torch.dtype
    num_heads: int
    kv_heads: int
    query_len: int
    key_len: int
    head_dim: int
    has_attn_mask: bool
    is_causal: bool
    # Images or prompts per call, folded into num_heads and kv_heads: the probe call is shaped (batch, heads per
    # item), so a layer that looks at one item's heads (the cuDNN guard: fewer than 8 key-value heads) sees what the
    # real call shows it.
    batch: int = 1

    @property
    def grouped(self) -> bool:
        return self.kv_heads != self.num_heads

    def scores_bytes(self) -> int:
        full = score_matrix_bytes(self.num_heads, self.query_len, self.key_len, self.device, self.dtype)
        if self.is_causal and not self.has_attn_mask:
            full += causal_mask_bytes(self.query_len, self.key_len, self.dtype)
        return full

    def operand_bytes(self) -> int:
        """Math's tensors other than the scores, which short calls with wide heads are made of more than of scores:
        the scaled query and key; for grouped-query calls the key and value repeated up to the query heads; the
        result; and, where math computes 16-bit inputs in fp32 (PyTorch's default on every device, unless
        `torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp` is set), the fp32 copies of q, k and v and the
        result cast back. The result is counted as well, so that the price bounds the growth the calibration
        measures (`scripts/calibrate_sdpa_math_memory.py`), which includes it."""
        upcast = self.dtype in _UPCAST and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
        compute = 4 if upcast else self.dtype.itemsize
        query = self.num_heads * self.query_len * self.head_dim
        key = self.num_heads * self.key_len * self.head_dim  # a key or value at the query heads
        elements = 2 * query + key  # scaled query, result, scaled key
        if self.grouped:
            elements += 2 * key
        total = elements * compute
        if upcast:
            total += (query + 2 * self.kv_heads * self.key_len * self.head_dim) * compute + query * self.dtype.itemsize
        return total

    def math_bytes(self) -> int:
        return self.scores_bytes() + self.operand_bytes()

    def chunked_math_bytes(self, chunk_bytes: int) -> int:
        """Math run in chunks whose scores stay under `chunk_bytes`."""
        return min(self.scores_bytes(), chunk_bytes) + self.operand_bytes()

    def probe_arguments(self) -> tuple[object, ...]:
        """A small call of this call's kind, as the router takes it: (q, k, v, attn_mask, dropout_p, is_causal,
        scale, enable_gqa), with lengths capped at 64 (kept unequal where they differ), the same batch and head
        layout, mask and causal flag."""
        query_len = min(self.query_len, _PROBE_LEN)
        key_len = min(self.key_len, _PROBE_LEN)
        if self.query_len != self.key_len and query_len == key_len:
            key_len += 1 if self.key_len > self.query_len else -1
        batch = self.batch if self.num_heads % self.batch == 0 and self.kv_heads % self.batch == 0 else 1
        q = torch.zeros(batch, self.num_heads // batch, query_len, self.head_dim, device=self.device, dtype=self.dtype)
        kv = torch.zeros(batch, self.kv_heads // batch, key_len, self.head_dim, device=self.device, dtype=self.dtype)
        mask = (
            torch.zeros(batch, 1, query_len, key_len, device=self.device, dtype=self.dtype)
            if self.has_attn_mask
            else None
        )
        causal = self.is_causal and not self.has_attn_mask
        return q, kv, kv, mask, 0.0, causal, None, self.grouped

    def probe_route(self) -> object:
        """The installed router's answer for the probe call (`probe_arguments`)."""
        router = STATE.router if STATE.router is not None else make_router(STATE)
        return router(*self.probe_arguments())


def _dispatcher_price(call: PricedCall) -> int:
    try:
        route = call.probe_route()
    except Exception:
        return call.math_bytes()
    return call.math_bytes() if route_name(route) in _MATERIALISING else 0


def sdpa_score_matrix_bytes(
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    num_heads: int,
    query_len: int,
    key_len: int,
    head_dim: int,
    kv_heads: int | None = None,
    has_attn_mask: bool = False,
    is_causal: bool = False,
    batch: int = 1,
) -> int:
    """Bytes one call materialises beyond its inputs: 0 on a fused kernel or Sage; on math the score matrix
    (heads x query_len x key_len x bytes per element, plus the causal mask for causal calls), math's copies of its
    operands (grouped-query key and value repeated up to the query heads) and its result, with the scores capped
    per chunk where the ROCm guard chunks. Pass batch x heads as `num_heads`, and batch x key-value heads as
    `kv_heads` for grouped-query calls (None: as many as `num_heads`), and the batch as `batch`, so that the kernel
    priced is the one a call with that many heads per item is served by.

    MPS, and any failure of the probe, count as materialising: the conservative answer.
    """
    call = PricedCall(
        device=torch.device(device),
        dtype=dtype,
        num_heads=num_heads,
        kv_heads=num_heads if kv_heads is None else kv_heads,
        query_len=query_len,
        key_len=key_len,
        head_dim=head_dim,
        has_attn_mask=has_attn_mask,
        is_causal=is_causal,
        batch=max(1, batch),
    )
    if call.device.type == "mps":
        return call.math_bytes()
    price: Callable[[], int] = lambda: _dispatcher_price(call)  # noqa: E731
    for layer in reversed(STATE.layers):
        price = _priced_by(layer, call, price)
    return price()


def _priced_by(layer, call: PricedCall, inner: Callable[[], int]) -> Callable[[], int]:  # type: ignore[no-untyped-def]
    return lambda: layer.price(STATE, call, inner)
