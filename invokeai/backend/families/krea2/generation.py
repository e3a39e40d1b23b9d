"""Krea-2: prompt encoding (tapped Qwen3-VL hidden states), flow-matching denoising, and VAE decoding.

Each function computes what diffusers' Krea2Pipeline computes for one image, so for the same components, prompt,
seed, steps and size the image is the pipeline's. The denoise loop also carries the server's attention controls:
the grouped-query processor (`krea2_attention`), the INVOKE_KREA2_SDPA_BACKEND window (read once per generation)
and the per-step benchmark that variable turns on.

Imports only torch and diffusers at module level (Pillow only in `vae_decode` and `preview_projection`, through
`generation.normalized_latents`), so the GPU benchmark can use it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from invokeai.backend.attention.benchmarking import WINDOW_MODES, StepBenchmark, sdpa_window, step_benchmark
from invokeai.backend.families.krea2.attention import install_krea2_attention
from invokeai.backend.families.krea2.constants import (
    LATENT_SCALE,
    PROMPT_PREFIX,
    PROMPT_SUFFIX,
    PROMPT_TOKENS,
    TEMPLATE_PREFIX_TOKENS,
    TEMPLATE_SUFFIX_TOKENS,
)
from invokeai.backend.generation import normalized_latents
from invokeai.backend.generation.steps import StepCallback, fresh_scheduler, seeded_generator, seeded_noise

if TYPE_CHECKING:
    from PIL import Image

# A benchmarking and support override, read once per generation: unset (the default) is the installed ranked
# list; a mode of `invokeai.backend.attention.benchmarking.WINDOW_MODES` opens that window for the whole generation
# and, on CUDA, times every step (docs/attention.md).
WINDOW_ENV = "INVOKE_KREA2_SDPA_BACKEND"


def window_mode_from_env() -> str | None:
    """The variable's value, validated; None when unset or empty."""
    raw = os.environ.get(WINDOW_ENV, "").strip()
    if not raw:
        return None
    if raw not in WINDOW_MODES:
        raise ValueError(
            f"{WINDOW_ENV}={raw!r} is not valid; valid values: unset (the ranked list), {', '.join(WINDOW_MODES)}"
        )
    return raw


MAX_SEQUENCE_LENGTH = PROMPT_TOKENS
# Qwen3-VL-4B layers whose hidden states Krea-2 stacks (0 is the embedding output); a model folder may name others.
SELECT_LAYERS: tuple[int, ...] = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
VAE_SCALE_FACTOR = LATENT_SCALE
DISTILLED_MU = 1.15


@dataclass(frozen=True)
class Krea2Settings:
    """The pipeline-level options a Krea-2 model folder carries in model_index.json."""

    select_layers: tuple[int, ...] = SELECT_LAYERS
    is_distilled: bool = False
    patch_size: int = 2

    @classmethod
    def from_model_index(cls, index: Mapping[str, Any]) -> Krea2Settings:
        layers = index.get("text_encoder_select_layers")
        return cls(
            select_layers=tuple(layers) if layers else SELECT_LAYERS,
            is_distilled=bool(index.get("is_distilled", False)),
            patch_size=int(index.get("patch_size", 2)),
        )


def _check_template(tokenizer: Any) -> None:
    # The prefix is cut by a fixed token count; a tokenizer that encodes it longer would cut the user's prompt away
    # and make every image ignore it, silently. Refuse that instead.
    length = len(tokenizer(PROMPT_PREFIX).input_ids)
    if length != TEMPLATE_PREFIX_TOKENS:
        raise ValueError(
            f"this tokenizer encodes the Krea-2 system prefix to {length} tokens, not {TEMPLATE_PREFIX_TOKENS}; "
            "the prompt would be cut away"
        )


@torch.inference_mode()
def encode_prompt(
    text_encoder: Any,
    tokenizer: Any,
    prompt: str,
    device: torch.device | str,
    *,
    select_layers: Sequence[int] = SELECT_LAYERS,
    max_sequence_length: int = MAX_SEQUENCE_LENGTH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(embeds (1, max_sequence_length, len(select_layers), hidden), mask (1, max_sequence_length) bool).

    The negative conditioning is the same call with the negative prompt; the pipeline's default is "".
    """
    _check_template(tokenizer)
    body = tokenizer(
        [PROMPT_PREFIX + prompt],
        truncation=True,
        padding="max_length",
        max_length=max_sequence_length + TEMPLATE_PREFIX_TOKENS - TEMPLATE_SUFFIX_TOKENS,
        return_tensors="pt",
    )
    suffix = tokenizer([PROMPT_SUFFIX], return_tensors="pt")
    input_ids = torch.cat([body.input_ids, suffix.input_ids], dim=1).to(device)
    mask = torch.cat([body.attention_mask, suffix.attention_mask], dim=1).bool().to(device)
    # Padding sits mid-sequence, so positions count real tokens only (the suffix keeps the phase it was trained
    # with); text positions are equal on the three mRoPE axes.
    positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)
    hidden = text_encoder(
        input_ids=input_ids, attention_mask=mask, position_ids=positions, output_hidden_states=True
    ).hidden_states
    embeds = torch.stack([hidden[layer] for layer in select_layers], dim=2)
    return embeds[:, TEMPLATE_PREFIX_TOKENS:], mask[:, TEMPLATE_PREFIX_TOKENS:]


def image_shift(image_tokens: int, scheduler_config: Mapping[str, Any]) -> float:
    """The dynamic shift mu: linear in the image token count between the scheduler's base and max points."""
    base_len = scheduler_config.get("base_image_seq_len", 256)
    max_len = scheduler_config.get("max_image_seq_len", 6400)
    base_shift = scheduler_config.get("base_shift", 0.5)
    max_shift = scheduler_config.get("max_shift", 1.15)
    slope = (max_shift - base_shift) / (max_len - base_len)
    return image_tokens * slope + (base_shift - slope * base_len)


def pack_latents(latents: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/p * W/p, C * p * p): the transformer's token layout."""
    b, c, h, w = latents.shape
    p = patch_size
    return latents.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)


def unpack_latents(tokens: torch.Tensor, height: int, width: int, patch_size: int) -> torch.Tensor:
    """Inverse of `pack_latents` for an image of height x width pixels."""
    b, _, channels = tokens.shape
    p = patch_size
    h, w = height // VAE_SCALE_FACTOR, width // VAE_SCALE_FACTOR
    grid = tokens.view(b, h // p, w // p, channels // (p * p), p, p).permute(0, 3, 1, 4, 2, 5)
    return grid.reshape(b, channels // (p * p), h, w)


def position_ids(text_tokens: int, grid_height: int, grid_width: int, device: torch.device) -> torch.Tensor:
    """(text_tokens + grid cells, 3) rotary coordinates: text at the origin, image cells at (0, row, column)."""
    rows = torch.arange(grid_height, device=device).repeat_interleave(grid_width)
    columns = torch.arange(grid_width, device=device).repeat(grid_height)
    image = torch.stack([torch.zeros_like(rows), rows, columns], dim=1).float()
    return torch.cat([torch.zeros(text_tokens, 3, device=device), image])


@torch.inference_mode()
def denoise(
    transformer: Any,
    scheduler: Any,
    *,
    prompt_embeds: torch.Tensor,
    prompt_mask: torch.Tensor,
    negative_embeds: torch.Tensor | None = None,
    negative_mask: torch.Tensor | None = None,
    width: int,
    height: int,
    steps: int,
    guidance_scale: float | Sequence[float] = 4.5,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
    on_step: StepCallback | None = None,
    is_distilled: bool = False,
    patch_size: int = 2,
    mu: float | None = None,
    benchmark: StepBenchmark | None = None,
) -> torch.Tensor:
    """Denoised latents (1, C, height/8, width/8), ready for `vae_decode`.

    Guidance follows Krea-2's convention: on whenever `guidance_scale > 0`, velocity = cond + scale * (cond -
    uncond), from two batch-1 transformer calls; the negative conditioning is then required (the pipeline encodes ""
    by default). `guidance_scale` may also be one scale per step (InvokeAI's per-step CFG): steps at 0 run the
    conditional call only. `mu` overrides the schedule's shift (the default: the distilled model's fixed mu, else
    the resolution-dependent one). `scheduler` is one from the family's `make_scheduler`
    (krea2/scheduler.py; a fresh copy is used).
    INVOKE_KREA2_SDPA_BACKEND is read once here; `benchmark` replaces the step benchmark that variable would build
    (the GPU benchmark passes its own). `on_step(step, total, latents)` gets unpacked latents after every step.
    """
    multiple = VAE_SCALE_FACTOR * patch_size
    if width % multiple or height % multiple:
        raise ValueError(f"width and height must be multiples of {multiple}, got {width}x{height}")
    scales = [float(guidance_scale)] * steps if isinstance(guidance_scale, (int, float)) else list(guidance_scale)
    if len(scales) != steps:
        raise ValueError(f"{len(scales)} guidance scales given for {steps} steps; give one per step or a single one")
    guided = any(scale > 0 for scale in scales)
    if guided and (negative_embeds is None or negative_mask is None):
        raise ValueError("guidance_scale > 0 needs negative_embeds and negative_mask (encode the negative prompt)")
    device = torch.device(device)
    window = window_mode_from_env()
    bench = benchmark if benchmark is not None else step_benchmark(device, window, "krea2_denoise")
    install_krea2_attention(transformer)
    scheduler = fresh_scheduler(scheduler)

    channels = transformer.config.in_channels // (patch_size * patch_size)
    noise = seeded_noise(
        (1, channels, height // VAE_SCALE_FACTOR, width // VAE_SCALE_FACTOR), seeded_generator(seed), device, dtype
    )
    latents = pack_latents(noise, patch_size)
    cond = (prompt_embeds.to(device=device, dtype=dtype), prompt_mask.to(device))
    uncond = (negative_embeds.to(device=device, dtype=dtype), negative_mask.to(device)) if guided else None
    positions = position_ids(cond[0].shape[1], height // multiple, width // multiple, device)
    if uncond is not None and uncond[0].shape[1] != cond[0].shape[1]:
        raise ValueError("prompt and negative embeddings must have the same sequence length (max_sequence_length)")

    if mu is None:
        mu = DISTILLED_MU if is_distilled else image_shift(latents.shape[1], scheduler.config)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), device=device, mu=mu)
    scheduler.set_begin_index(0)
    timesteps = scheduler.timesteps

    def velocity(
        latents: torch.Tensor, conditioning: tuple[torch.Tensor, torch.Tensor], timestep: torch.Tensor
    ) -> torch.Tensor:
        embeds, mask = conditioning
        return transformer(
            hidden_states=latents,
            encoder_hidden_states=embeds,
            timestep=timestep,
            position_ids=positions,
            encoder_attention_mask=mask,
            return_dict=False,
        )[0]

    with sdpa_window(window, f"{WINDOW_ENV}={window}"):
        if bench is not None:
            bench.start()
        for index, t in enumerate(timesteps):
            with bench.step() if bench is not None else contextlib.nullcontext():
                timestep = (t / scheduler.config.num_train_timesteps).expand(latents.shape[0]).to(dtype)
                v = velocity(latents, cond, timestep)
                if uncond is not None and scales[index] > 0:
                    v = v + scales[index] * (v - velocity(latents, uncond, timestep))
                latents = scheduler.step(v, t, latents, return_dict=False)[0]
            if on_step is not None:
                on_step(index + 1, len(timesteps), unpack_latents(latents, height, width, patch_size))
    if bench is not None:
        bench.log()
    return unpack_latents(latents, height, width, patch_size)


def vae_decode(vae: Any, latents: torch.Tensor) -> Image.Image:
    """The RGB image the pipeline returns for these (unpacked) latents."""
    return normalized_latents.decode(vae, latents, VAE_SCALE_FACTOR)[0]


# The step-preview map is fitted to the VAE, the same way for every VAE of its kind.
known_preview_projection = normalized_latents.known_preview_projection
preview_projection = normalized_latents.preview_projection
