"""What a working-memory estimate is made of: the facts of one node call, the attention calls it makes, and the sum.

An estimate is an activation term (tensors alive at the forward pass's peak, weights and inputs excluded) plus the
score matrix of the attention calls, each priced by `sdpa_score_matrix_bytes`: zero where the installed dispatcher
picks a fused kernel, the whole matrix where a call lands on math (pinned `attention_backend: math`, or a call no
fused kernel can serve). Calls run one after another and each frees its matrix on return, so the reservation adds
the largest one, not all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from invokeai.backend.attention import sdpa_score_matrix_bytes


@dataclass(frozen=True)
class CallFacts:
    """One node call. `batch` is images per denoise or VAE call and prompts per text-encoder call; the family's
    estimator applies its own guidance layout (SD-1 doubles the UNet batch, Krea-2 makes two batch-1 calls).
    `prompt_tokens` is the text length the denoiser conditions on (None: the family's fixed length, 77 for CLIP,
    512 for Krea-2's padded block). `text_padded`: the prompt is shorter than that length, so masks are passed.
    Editing models see reference images: `vision_patches` gives the (rows, columns) of patches a text encoder's
    vision tower cuts each into, `reference_sizes` the (width, height) in pixels of each image whose latents a
    denoiser takes beside the generated ones."""

    device: torch.device
    dtype: torch.dtype
    width: int = 512
    height: int = 512
    batch: int = 1
    prompt_tokens: int | None = None
    guidance: bool = True
    text_padded: bool = True
    vision_patches: tuple[tuple[int, int], ...] = ()
    reference_sizes: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class AttentionCall:
    """`count` identical SDPA calls; `num_heads` includes the batch (batch x query heads), and so does `kv_heads`
    for a grouped-query call that passes its key-value heads as they are (`enable_gqa`; None: as many as
    `num_heads`, for calls whose key and value are repeated before SDPA)."""

    num_heads: int
    query_len: int
    key_len: int
    head_dim: int
    kv_heads: int | None = None
    has_attn_mask: bool = False
    is_causal: bool = False
    count: int = 1
    batch: int = 1  # the batch folded into num_heads and kv_heads, so that the priced call has one item's heads

    def score_matrix_bytes(self, device: torch.device | str, dtype: torch.dtype) -> int:
        """What one of these calls materialises, as the installed dispatcher would serve it."""
        return sdpa_score_matrix_bytes(
            device=device,
            dtype=dtype,
            num_heads=self.num_heads,
            query_len=self.query_len,
            key_len=self.key_len,
            head_dim=self.head_dim,
            kv_heads=self.kv_heads,
            has_attn_mask=self.has_attn_mask,
            is_causal=self.is_causal,
            batch=self.batch,
        )


@dataclass(frozen=True)
class WorkingMemory:
    activation_bytes: int
    attention_calls: list[AttentionCall] = field(default_factory=list)

    def score_matrix_bytes(self, device: torch.device | str, dtype: torch.dtype) -> int:
        """The largest score matrix among the calls: they run in sequence, so only one is alive at a time."""
        return max((call.score_matrix_bytes(device, dtype) for call in self.attention_calls), default=0)

    def total(self, device: torch.device | str, dtype: torch.dtype) -> int:
        """Bytes to reserve, under the attention policy installed when this is called."""
        return self.activation_bytes + self.score_matrix_bytes(device, dtype)


# A diffusers FrozenDict, a transformers PretrainedConfig or a parsed config.json.
ConfigLike = Any
Estimator = Callable[[ConfigLike, CallFacts], WorkingMemory]


def config_dict(config: ConfigLike) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise TypeError(f"not a model config: {type(config).__name__}")


def per_block(value: Any, blocks: int) -> list[Any]:
    """diffusers configs give some settings once for all blocks or once per block."""
    if isinstance(value, list | tuple):
        if len(value) != blocks:
            raise ValueError(f"expected {blocks} per-block values, got {len(value)}")
        return list(value)
    return [value] * blocks


def halve(size: int, times: int) -> int:
    """A side after `times` stride-2, padding-1 convolutions (odd sides round up)."""
    for _ in range(times):
        size = (size + 1) // 2
    return size


def fp32_bytes(dtype: torch.dtype) -> int:
    """Element size of a tensor a layer upcasts to fp32 whatever the model dtype (norms, softmax, interpolation)."""
    return max(dtype.itemsize, 4)
