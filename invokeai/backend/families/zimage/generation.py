"""Z-Image: prompt encoding (Qwen3's second-to-last hidden state of the chat-templated prompt), flow-matching
denoising (text-to-image and image-to-image, classifier-free guidance as one batched transformer call), and coding
with FLUX.1's 16-channel AutoencoderKL.

Each function computes what diffusers' ZImagePipeline / ZImageImg2ImgPipeline compute for one image, so for the same
components, prompts, seed, steps, guidance and size the image is the pipeline's. Guidance is in InvokeAI's
convention, `guidance_scale` g: velocity = neg + g (pos - neg), so 1 is no guidance (Turbo) and diffusers'
`guidance_scale` is g - 1 (its pos + (g - 1)(pos - neg), computed exactly as the pipeline writes it).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from invokeai.backend.families.zimage.constants import (
    HIDDEN_STATE,
    LATENT_SCALE,
    PATCH,
    SHIFT_DEFAULTS,
    SIZE_MULTIPLE,
    TEXT_TOKENS,
    TIMESTEP_SCALE,
)
from invokeai.backend.generation import shifted_latents
from invokeai.backend.generation.steps import StepCallback, fresh_scheduler, seeded_generator, seeded_noise

if TYPE_CHECKING:
    from PIL import Image


def chat_prompt(tokenizer: Any, prompt: str) -> str:
    """The prompt inside the tokenizer's chat template, as the pipeline renders it (one user turn, generation
    prompt, thinking enabled: Qwen3's template then adds no empty think block)."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=True
    )


@torch.inference_mode()
def encode_prompt(
    text_encoder: Any,
    tokenizer: Any,
    prompt: str,
    device: torch.device | str,
    *,
    max_sequence_length: int = TEXT_TOKENS,
) -> torch.Tensor:
    """Caption features (tokens, hidden) in the text encoder's dtype: the second-to-last hidden state of the
    chat-templated prompt, padded (or cut) to `max_sequence_length` and run with its attention mask, keeping only
    the unpadded tokens. The negative prompt is the same call (the pipeline's default negative is "")."""
    if max_sequence_length < 1:
        raise ValueError(f"max_sequence_length must be at least 1, got {max_sequence_length}")
    inputs = tokenizer(
        [chat_prompt(tokenizer, prompt)],
        padding="max_length",
        max_length=max_sequence_length,
        truncation=True,
        return_tensors="pt",
    )
    ids = inputs.input_ids.to(device)
    mask = inputs.attention_mask.to(device).bool()
    hidden = text_encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[HIDDEN_STATE]
    return hidden[0][mask[0]]


def image_shift(image_tokens: int, scheduler_config: Mapping[str, Any]) -> float:
    """The resolution-dependent shift mu the pipeline passes: linear in the image token count between the config's
    base and max points (used only by a scheduler configured with use_dynamic_shifting)."""
    c = {key: scheduler_config.get(key, default) for key, default in SHIFT_DEFAULTS.items()}
    slope = (c["max_shift"] - c["base_shift"]) / (c["max_image_seq_len"] - c["base_image_seq_len"])
    return image_tokens * slope + (c["base_shift"] - slope * c["base_image_seq_len"])


def default_sigmas(steps: int) -> list[float]:
    """ZImagePipeline's schedule before the scheduler's shift: steps values from 1 down to 1/steps (float32)."""
    return torch.linspace(1.0, 1 / steps, steps).tolist()


def check_size(width: int, height: int) -> None:
    if width <= 0 or height <= 0 or width % SIZE_MULTIPLE or height % SIZE_MULTIPLE:
        raise ValueError(
            f"width and height must be positive multiples of {SIZE_MULTIPLE} (the VAE's 8 times the 2x2 patches), "
            f"got {width}x{height}"
        )


def _img2img_start(steps: int, strength: float) -> int:
    """The first step strength keeps, as ZImageImg2ImgPipeline.get_timesteps counts it."""
    kept = min(steps * strength, steps)
    return int(max(steps - kept, 0))


def _set_timesteps(scheduler: Any, steps: int, mu: float, device: torch.device) -> None:
    # As the pipeline's retrieve_timesteps with its default sigmas (euler and lcm both take sigmas and mu).
    scheduler.set_timesteps(sigmas=default_sigmas(steps), device=device, mu=mu)


def _takes_generator(scheduler: Any) -> bool:
    """Stochastic samplers (LCM) draw fresh noise in step(); it comes from the seed's generator here."""
    return "generator" in inspect.signature(scheduler.step).parameters


@torch.inference_mode()
def denoise(
    transformer: Any,
    scheduler: Any,
    *,
    prompt_embeds: torch.Tensor,
    negative_embeds: torch.Tensor | None = None,
    width: int,
    height: int,
    steps: int,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
    guidance_scale: float = 1.0,
    cfg_truncation: float = 1.0,
    cfg_normalization: float = 0.0,
    init_latents: torch.Tensor | None = None,
    strength: float = 1.0,
    on_step: StepCallback | None = None,
) -> torch.Tensor:
    """Denoised latents (1, 16, height/8, width/8), float32, ready for `vae_decode`.

    `prompt_embeds` / `negative_embeds` are `encode_prompt` outputs (tokens, hidden), any lengths. `guidance_scale`
    is InvokeAI's CFG g (see the module docstring): above 1 the positive and negative captions run as one batch of
    two (masked when their padded lengths differ) and `negative_embeds` is required; 1 runs the positive alone.
    `cfg_truncation` and `cfg_normalization` are the pipeline's: guidance is dropped at steps whose normalised time
    (1000 - t) / 1000 exceeds the truncation, and a normalisation > 0 caps the guided velocity's norm at that many
    times the positive one's. Without `init_latents` this is text-to-image; with latents from `vae_encode(vae, image,
    seed)` it is image-to-image, `strength` of the way into the schedule. `dtype` is the transformer's compute
    dtype; the latents and the scheduler stay float32, as in the pipeline. `on_step(step, total, latents)` gets the
    latents after every step; `total` counts the steps actually run.
    """
    check_size(width, height)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be within [0, 1], got {strength}")
    if guidance_scale < 1.0:
        raise ValueError(f"guidance_scale must be at least 1 (1: no guidance), got {guidance_scale}")
    diffusers_guidance = guidance_scale - 1.0
    guided = diffusers_guidance > 0
    if guided and negative_embeds is None:
        raise ValueError('guidance_scale > 1 needs negative_embeds (encode the negative prompt, "" by default)')
    device = torch.device(device)
    scheduler = fresh_scheduler(scheduler)
    generator = seeded_generator(seed)
    channels = transformer.config.in_channels
    shape = (1, channels, height // LATENT_SCALE, width // LATENT_SCALE)
    image_tokens = (shape[2] // PATCH) * (shape[3] // PATCH)

    _set_timesteps(scheduler, steps, image_shift(image_tokens, scheduler.config), device)
    if init_latents is None:
        timesteps = scheduler.timesteps
        scheduler.set_begin_index(0)
        latents = seeded_noise(shape, generator, device, torch.float32)
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
        seeded_noise(shape, generator, "cpu", torch.float32)
        noise = seeded_noise(shape, generator, device, torch.float32)
        latents = scheduler.scale_noise(init_latents.to(device=device, dtype=torch.float32), timesteps[:1], noise)

    positive = prompt_embeds.to(device=device, dtype=dtype)
    negative = negative_embeds.to(device=device, dtype=dtype) if guided and negative_embeds is not None else None
    # Normalised times, as the pipeline precomputes them for the truncation test.
    t_norms = ((TIMESTEP_SCALE - timesteps.float()) / TIMESTEP_SCALE).tolist()
    step_kwargs = {"generator": generator} if _takes_generator(scheduler) else {}

    total = len(timesteps)
    for index, t in enumerate(timesteps):
        timestep = (TIMESTEP_SCALE - t.expand(1)) / TIMESTEP_SCALE
        apply_cfg = negative is not None and not (cfg_truncation <= 1 and t_norms[index] > cfg_truncation)
        model_latents = latents.to(dtype)
        if apply_cfg:
            inputs = list(model_latents.repeat(2, 1, 1, 1).unsqueeze(2).unbind(dim=0))
            out = transformer(inputs, timestep.repeat(2), [positive, negative], return_dict=False)[0]
            pos, neg = out[0].float(), out[1].float()
            velocity = pos + diffusers_guidance * (pos - neg)
            if cfg_normalization > 0.0:
                original_norm = torch.linalg.vector_norm(pos)
                new_norm = torch.linalg.vector_norm(velocity)
                max_norm = original_norm * float(cfg_normalization)
                if new_norm > max_norm:
                    velocity = velocity * (max_norm / new_norm)
        else:
            out = transformer(list(model_latents.unsqueeze(2).unbind(dim=0)), timestep, [positive], return_dict=False)
            velocity = out[0][0].float()
        # The transformer predicts the clean-image direction; the scheduler steps along its negative.
        noise_pred = -velocity.unsqueeze(0).squeeze(2)
        latents = scheduler.step(noise_pred.to(torch.float32), t, latents, return_dict=False, **step_kwargs)[0]
        if on_step is not None:
            on_step(index + 1, total, latents)
    return latents


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
