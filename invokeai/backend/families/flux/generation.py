"""FLUX.1: prompt encoding (CLIP-L pooled output, T5 hidden states), flow-matching denoising over packed latents
(text-to-image and image-to-image), and coding with the 16-channel AutoencoderKL.

Each function computes what diffusers' FluxPipeline / FluxImg2ImgPipeline compute for one image (no true CFG,
IP-adapter or LoRA scale), so for the same components, prompt, seed, steps, guidance and size the image is the
pipeline's. dev and schnell differ only in what the transformer's config says (`guidance_embeds`) and the T5 length
they are run with (`constants.default_t5_tokens`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from invokeai.backend.families.flux.constants import (
    DEFAULT_GUIDANCE,
    LATENT_SCALE,
    PATCH,
    SHIFT_DEFAULTS,
    SIZE_MULTIPLE,
    TIMESTEP_SCALE,
)
from invokeai.backend.generation import shifted_latents
from invokeai.backend.generation.steps import StepCallback, fresh_scheduler, seeded_generator, seeded_noise

if TYPE_CHECKING:
    from PIL import Image


@torch.inference_mode()
def encode_clip(text_encoder: Any, tokenizer: Any, prompt: str, device: torch.device | str) -> torch.Tensor:
    """CLIP's pooled output (1, hidden) in the text encoder's dtype: FLUX conditions its modulation on it."""
    ids = tokenizer(
        [prompt], padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    ).input_ids
    pooled = text_encoder(ids.to(device), output_hidden_states=False).pooler_output
    return pooled.to(device=device, dtype=text_encoder.dtype)


@torch.inference_mode()
def encode_t5(
    text_encoder: Any, tokenizer: Any, prompt: str, device: torch.device | str, max_sequence_length: int
) -> torch.Tensor:
    """T5's last hidden states (1, max_sequence_length, d_model): the prompt padded to that length and passed
    without a mask, as the pipeline does, so the padding tokens condition the image too."""
    if max_sequence_length < 1:
        raise ValueError(f"max_sequence_length must be at least 1, got {max_sequence_length}")
    ids = tokenizer(
        [prompt], padding="max_length", max_length=max_sequence_length, truncation=True, return_tensors="pt"
    ).input_ids
    hidden = text_encoder(ids.to(device), output_hidden_states=False)[0]
    return hidden.to(device=device, dtype=text_encoder.dtype)


def image_shift(image_tokens: int, scheduler_config: Mapping[str, Any]) -> float:
    """The resolution-dependent shift mu: linear in the image token count between the config's base and max."""
    c = {key: scheduler_config.get(key, default) for key, default in SHIFT_DEFAULTS.items()}
    slope = (c["max_shift"] - c["base_shift"]) / (c["max_image_seq_len"] - c["base_image_seq_len"])
    return image_tokens * slope + (c["base_shift"] - slope * c["base_image_seq_len"])


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> (B, h/2 * w/2, 4C): each 2x2 cell becomes one token, channels outermost."""
    b, c, h, w = latents.shape
    cells = latents.view(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 2, 4, 1, 3, 5)
    return cells.reshape(b, (h // PATCH) * (w // PATCH), c * PATCH * PATCH)


def unpack_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of `pack_latents` for an image of height x width pixels."""
    b, _, channels = tokens.shape
    h, w = height // LATENT_SCALE, width // LATENT_SCALE
    grid = tokens.view(b, h // PATCH, w // PATCH, channels // (PATCH * PATCH), PATCH, PATCH).permute(0, 3, 1, 4, 2, 5)
    return grid.reshape(b, channels // (PATCH * PATCH), h, w)


def image_ids(grid_height: int, grid_width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(grid cells, 3) rotary coordinates of the image tokens: (0, row, column), row-major."""
    ids = torch.zeros(grid_height, grid_width, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(grid_height)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(grid_width)[None, :]
    return ids.reshape(grid_height * grid_width, 3).to(device=device, dtype=dtype)


def check_size(width: int, height: int) -> None:
    if width <= 0 or height <= 0 or width % SIZE_MULTIPLE or height % SIZE_MULTIPLE:
        raise ValueError(
            f"width and height must be positive multiples of {SIZE_MULTIPLE} (the VAE's 8 times the 2x2 packing), "
            f"got {width}x{height}"
        )


def _img2img_start(steps: int, strength: float) -> int:
    """The first step strength keeps, as FluxImg2ImgPipeline.get_timesteps counts it (not SD's int(steps x s))."""
    kept = min(steps * strength, steps)
    return int(max(steps - kept, 0))


@torch.inference_mode()
def denoise(
    transformer: Any,
    scheduler: Any,
    *,
    prompt_embeds: torch.Tensor,
    pooled_embeds: torch.Tensor,
    width: int,
    height: int,
    steps: int,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
    guidance: float = DEFAULT_GUIDANCE,
    init_latents: torch.Tensor | None = None,
    strength: float = 1.0,
    on_step: StepCallback | None = None,
) -> torch.Tensor:
    """Denoised latents (1, 16, height/8, width/8), ready for `vae_decode`.

    `guidance` feeds the guidance embedding of a guidance-distilled model (dev); a model without one (schnell)
    ignores it, as the pipeline does. Without `init_latents` this is text-to-image; with latents from
    `vae_encode(vae, image, seed)` it is image-to-image, `strength` of the way into the schedule. `on_step(step,
    total, latents)` gets unpacked latents after every step; `total` counts the steps actually run.
    """
    check_size(width, height)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be within [0, 1], got {strength}")
    device = torch.device(device)
    scheduler = fresh_scheduler(scheduler)
    generator = seeded_generator(seed)
    channels = transformer.config.in_channels // (PATCH * PATCH)
    shape = (1, channels, height // LATENT_SCALE, width // LATENT_SCALE)
    grid_h, grid_w = shape[2] // PATCH, shape[3] // PATCH

    # FluxPipeline lets a scheduler config's use_flow_sigmas replace its sigmas; FluxImg2ImgPipeline does not read it.
    flow_sigmas = init_latents is None and scheduler.config.get("use_flow_sigmas")
    sigmas = None if flow_sigmas else np.linspace(1.0, 1 / steps, steps)
    mu = image_shift(grid_h * grid_w, scheduler.config)
    if sigmas is None:
        scheduler.set_timesteps(steps, device=device, mu=mu)
    else:
        scheduler.set_timesteps(sigmas=sigmas, device=device, mu=mu)
    if init_latents is None:
        timesteps = scheduler.timesteps
        latents = pack_latents(seeded_noise(shape, generator, device, dtype))
        scheduler.set_begin_index(0)
    else:
        if tuple(init_latents.shape) != shape:
            raise ValueError(f"init_latents have shape {tuple(init_latents.shape)}; {width}x{height} needs {shape}")
        start = _img2img_start(len(scheduler.timesteps), strength) * scheduler.order
        timesteps = scheduler.timesteps[start:]
        if len(timesteps) < 1:
            raise ValueError(f"strength {strength} with {steps} steps leaves no step to run; raise either")
        scheduler.set_begin_index(start)
        # The img2img pipeline drew the VAE posterior sample (vae_encode) from this same generator first; its noise
        # is the generator's next draw, of the same shape.
        seeded_noise(shape, generator, "cpu", dtype)
        noise = seeded_noise(shape, generator, device, dtype)
        noised = scheduler.scale_noise(init_latents.to(device=device, dtype=dtype), timesteps[:1].repeat(1), noise)
        latents = pack_latents(noised)

    text = prompt_embeds.to(device=device, dtype=dtype)
    pooled = pooled_embeds.to(device=device, dtype=dtype)
    text_ids = torch.zeros(text.shape[1], 3, device=device, dtype=dtype)
    img_ids = image_ids(grid_h, grid_w, device, dtype)
    embedded_guidance = None
    if transformer.config.guidance_embeds:
        embedded_guidance = torch.full([1], guidance, device=device, dtype=torch.float32).expand(latents.shape[0])

    total = len(timesteps)
    for index, t in enumerate(timesteps):
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        velocity = transformer(
            hidden_states=latents,
            timestep=timestep / TIMESTEP_SCALE,
            guidance=embedded_guidance,
            pooled_projections=pooled,
            encoder_hidden_states=text,
            txt_ids=text_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]
        latents = scheduler.step(velocity, t, latents, return_dict=False)[0]
        if on_step is not None:
            on_step(index + 1, total, unpack_latents(latents, height, width))
    return unpack_latents(latents, height, width)


def vae_decode(vae: Any, latents: torch.Tensor) -> Image.Image:
    """The RGB image the pipeline returns for these (scaled and shifted) latents."""
    return shifted_latents.decode(vae, latents, SIZE_MULTIPLE)


def vae_encode(vae: Any, image: Image.Image, seed: int) -> torch.Tensor:
    """The latents the denoiser works in, sampled from the VAE posterior with the seed's generator, as the img2img
    pipeline prepares them. Pass the same seed to `denoise`, whose noise continues that generator's stream."""
    check_size(image.width, image.height)
    return shifted_latents.encode(vae, image, seed, SIZE_MULTIPLE)


# The step-preview map is fitted to the VAE, the same way for every VAE of this kind.
known_preview_projection = shifted_latents.known_preview_projection
preview_projection = shifted_latents.preview_projection
