"""The attention calls the GPU check measures, each as the model makes it at 1024x1024, and the same calls scaled
down for a CPU rehearsal. benchmarks/attention_kernels.py and benchmarks/attention_choices.py import this as
`_attention_calls` (they run as `python benchmarks/NAME.py`, so this folder is sys.path[0]).

- FLUX.1's joint attention: 24 heads of 128 over 4096 image + 512 text tokens (pytorch#142132's shape).
- SDXL's UNet (1024x1024 is a 128x128 latent): the 64x64 level (640 channels: 10 heads of 64) and the 32x32 level
  (1280 channels: 20 heads of 64); each block attends to itself and, across, to the 77 tokens of the prompt. The
  batch is 2: classifier-free guidance runs the positive and negative prompts together.
- Krea-2's main blocks: 48 heads of 128 over 4096 image + 512 text tokens, K/V expanded to the query heads as
  diffusers' processor passes them, with the additive (B, 1, 1, T) padding mask of a 77-token prompt padded to 512.
- Qwen3's self-attention (Krea-2's text encoder, the grouped-query case of pytorch#193893): 32 query and 8
  key-value heads of 128 over 512 tokens, causal, the key-value heads passed as they are (`enable_gqa`), as
  transformers' SDPA path passes an unpadded prompt.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.nn.attention import SDPBackend

Mask = Literal["none", "padding", "causal"]

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class CallShape:
    """One SDPA call: query [batch, heads, query_len, head_dim], key and value [batch, kv_heads, key_len, head_dim]."""

    label: str
    batch: int
    heads: int
    query_len: int
    head_dim: int
    key_len: int | None = None  # None: self-attention (query_len)
    kv_heads: int | None = None  # None: as many as `heads`; fewer: grouped-query, passed with enable_gqa
    mask: Mask = "none"
    padded_keys: int = 0  # "padding": how many keys the additive mask hides

    @property
    def keys(self) -> int:
        return self.query_len if self.key_len is None else self.key_len

    @property
    def key_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    def describe(self, dtype: torch.dtype) -> str:
        kv = f"{self.key_heads}x{self.keys}" if (self.kv_heads, self.key_len) != (None, None) else ""
        shape = f"[{self.batch}, {self.heads}, {self.query_len}, {self.head_dim}]" + (f" kv {kv}" if kv else "")
        mask = {
            "none": "no mask",
            "padding": f"additive (B, 1, 1, T) padding mask hiding {self.padded_keys} keys",
            "causal": "is_causal",
        }[self.mask]
        gqa = ", enable_gqa" if self.kv_heads is not None else ""
        return f"{self.label}: {shape} {str(dtype).removeprefix('torch.')}, {mask}{gqa}"

    def inputs(
        self, device: torch.device, dtype: torch.dtype, seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Seeded q, k, v on `device` and the keyword arguments the model passes with them."""
        generator = torch.Generator(device=device).manual_seed(seed)
        q = torch.randn(
            self.batch, self.heads, self.query_len, self.head_dim, generator=generator, device=device, dtype=dtype
        )
        k, v = (
            torch.randn(
                self.batch, self.key_heads, self.keys, self.head_dim, generator=generator, device=device, dtype=dtype
            )
            for _ in range(2)
        )
        kwargs: dict[str, Any] = {}
        if self.mask == "padding":
            # A finite large negative, as a converted padding mask holds; the hidden keys are the prompt's padding.
            mask = torch.zeros(self.batch, 1, 1, self.keys, device=device, dtype=dtype)
            mask[..., self.keys - self.padded_keys :] = torch.finfo(dtype).min
            kwargs["attn_mask"] = mask
        elif self.mask == "causal":
            kwargs["is_causal"] = True
        if self.kv_heads is not None:
            kwargs["enable_gqa"] = True
        return q, k, v, kwargs

    def priced_kwargs(self) -> dict[str, Any]:
        """The call's terms for `sdpa_score_matrix_bytes` (heads with the batch folded in, as it takes them)."""
        return {
            "num_heads": self.batch * self.heads,
            "kv_heads": self.batch * self.key_heads if self.kv_heads is not None else None,
            "query_len": self.query_len,
            "key_len": self.keys,
            "head_dim": self.head_dim,
            "has_attn_mask": self.mask == "padding",
            "is_causal": self.mask == "causal",
            "batch": self.batch,
        }


# Most telling first: a run cut short by its time limit has measured these.
MODEL_CALLS: tuple[CallShape, ...] = (
    CallShape("flux joint 1024", 1, 24, 4608, 128),
    CallShape("krea2 masked 1024", 1, 48, 4608, 128, mask="padding", padded_keys=512 - 77),
    CallShape("qwen3 gqa causal", 1, 32, 512, 128, kv_heads=8, mask="causal"),
    CallShape("sdxl self 64x64", 2, 10, 4096, 64),
    CallShape("sdxl cross 64x64", 2, 10, 4096, 64, key_len=77),
    CallShape("sdxl self 32x32", 2, 20, 1024, 64),
    CallShape("sdxl cross 32x32", 2, 20, 1024, 64, key_len=77),
)

# The same calls with fewer heads and tokens: what a 2-core CPU runs in a second or two (--tiny, the dry run).
TINY_CALLS: tuple[CallShape, ...] = (
    CallShape("flux joint tiny", 1, 2, 288, 128),
    CallShape("krea2 masked tiny", 1, 4, 288, 128, mask="padding", padded_keys=27),
    CallShape("qwen3 gqa causal tiny", 1, 4, 64, 128, kv_heads=1, mask="causal"),
    CallShape("sdxl self tiny", 2, 2, 256, 64),
    CallShape("sdxl cross tiny", 2, 2, 256, 64, key_len=77),
)


def parse_dtypes(text: str) -> tuple[torch.dtype, ...]:
    """`bf16,fp16` -> (torch.bfloat16, torch.float16); exits through ValueError naming the valid names."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in DTYPES]
    if unknown or not names:
        raise ValueError(f"unknown dtype {', '.join(unknown) or text!r}: valid are {', '.join(DTYPES)}")
    return tuple(DTYPES[name] for name in names)


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in DTYPES.items() if value == dtype)


def dispatcher_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict[str, Any]) -> str:
    """The kernel PyTorch's own dispatcher picks for the call under the flags and order now in force."""
    choice = torch._fused_sdp_choice(
        q, k, v, kwargs.get("attn_mask"), 0.0, kwargs.get("is_causal", False),
        enable_gqa=kwargs.get("enable_gqa", False),
    )  # fmt: skip
    return SDPBackend(choice).name


def add_call_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark of these calls takes: the device, the scaled-down calls, the dtypes."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="the calls scaled down (a CPU rehearsal)")
    parser.add_argument("--dtypes", help="comma-separated: bf16, fp16, fp32 (default bf16,fp16 on CUDA, fp32 on CPU)")


def chosen_calls(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[torch.device, tuple[torch.dtype, ...], tuple[CallShape, ...]]:
    """The device, dtypes and calls `add_call_arguments`' options name; a CUDA device without CUDA, or an unknown
    dtype, is the parser's error. The CPU always gets the scaled-down calls."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    try:
        dtypes = parse_dtypes(args.dtypes or ("bf16,fp16" if device.type == "cuda" else "fp32"))
    except ValueError as error:
        parser.error(str(error))
    calls = TINY_CALLS if args.tiny or device.type == "cpu" else MODEL_CALLS
    return device, dtypes, calls
