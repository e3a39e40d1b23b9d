"""FLUX.1: prompt encoding (CLIP-L pooled output, T5 hidden states), flow-matching denoising over packed latents
(text-to-image and image-to-image), and coding with the 16-channel AutoencoderKL.

Each function computes what diffusers' FluxPipeline / FluxImg2ImgPipeline compute for one image (no true CFG,
IP-adapter or LoRA scale), so for the same components, prompt, seed, steps, guidance and size the image is the
pipeline's. dev and schnell differ only in what the transformer's config says (`guidance_embeds`) and the T5 length
they are run with (`constants.default_t5_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from invokeai.backend.families.flux.constants import (
    DEFAULT_GUIDANCE,
    LATENT_CHANNELS,
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


@dataclass(frozen=True)
class Prompt:
    """One encoded prompt: T5's hidden states (1, tokens, d_model) and CLIP's pooled output (1, hidden)."""

    embeds: torch.Tensor
    pooled: torch.Tensor


class _Velocity:
    """The transformer's velocity for packed latents at a scheduler timestep (0..1000), called as FluxPipeline calls
    it; with a negative prompt and a scale other than 1, InvokeAI's true classifier-free guidance on top:
    negative + scale x (positive - negative). Both denoise paths run the transformer through this one call."""

    def __init__(
        self,
        transformer: Any,
        positive: Prompt,
        negative: Prompt | None,
        grid: tuple[int, int],
        guidance: float,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.transformer = transformer
        self.prompts = [self._inputs(p, device, dtype) for p in (positive, negative) if p is not None]
        self.img_ids = image_ids(*grid, device, dtype)
        self.guidance = None
        if transformer.config.guidance_embeds:
            self.guidance = torch.full([1], guidance, device=device, dtype=torch.float32)

    @staticmethod
    def _inputs(prompt: Prompt, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        text = prompt.embeds.to(device=device, dtype=dtype)
        pooled = prompt.pooled.to(device=device, dtype=dtype)
        return text, pooled, torch.zeros(text.shape[1], 3, device=device, dtype=dtype)

    def _one(self, latents: torch.Tensor, timestep: torch.Tensor, index: int) -> torch.Tensor:
        text, pooled, text_ids = self.prompts[index]
        guidance = None if self.guidance is None else self.guidance.expand(latents.shape[0])
        return self.transformer(
            hidden_states=latents,
            timestep=timestep / TIMESTEP_SCALE,
            guidance=guidance,
            pooled_projections=pooled,
            encoder_hidden_states=text,
            txt_ids=text_ids,
            img_ids=self.img_ids,
            return_dict=False,
        )[0]

    def __call__(self, latents: torch.Tensor, t: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        positive = self._one(latents, timestep, 0)
        if math.isclose(cfg_scale, 1.0):
            return positive
        if len(self.prompts) < 2:
            raise ValueError("a cfg_scale other than 1 needs a negative prompt's conditioning")
        negative = self._one(latents, timestep, 1)
        return negative + cfg_scale * (positive - negative)


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

    prompt = Prompt(prompt_embeds, pooled_embeds)
    velocity = _Velocity(transformer, prompt, None, (grid_h, grid_w), guidance, device, dtype)
    total = len(timesteps)
    for index, t in enumerate(timesteps):
        latents = scheduler.step(velocity(latents, t, 1.0), t, latents, return_dict=False)[0]
        if on_step is not None:
            on_step(index + 1, total, unpack_latents(latents, height, width))
    return unpack_latents(latents, height, width)


# InvokeAI's flux_denoise. It draws its noise in half precision, keeps its own schedule (steps + 1 times from 1 to
# 0, shifted for dev, cut fractionally at denoising_start and denoising_end), starts image-to-image from a blend of
# the latents and that noise at exactly 1 - denoising_start, and samples with a diffusers scheduler built on its
# default config. Text-to-image on dev or schnell is FluxPipeline's computation from that noise (the schedule's
# values are the pipeline's sigmas); the functions below reproduce InvokeAI's choices so that its graphs give its
# images.

SAMPLERS = ("euler", "heun", "lcm")  # InvokeAI's FLUX scheduler names
STOCHASTIC_SEED_MASK = 0xFFFFFFFF  # InvokeAI seeds a stochastic sampler's step noise with seed ^ this (SD's rule)


def invokeai_noise(width: int, height: int, seed: int, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """The noise InvokeAI's flux_denoise starts from: (1, 16, height/8, width/8) drawn in float16 on the CPU from
    torch.Generator("cpu").manual_seed(seed), then cast. It is FluxPipeline's CPU draw (same generator, shape and
    stream) rounded to half precision."""
    check_size(width, height)
    shape = (1, LATENT_CHANNELS, height // LATENT_SCALE, width // LATENT_SCALE)
    noise = torch.randn(shape, generator=seeded_generator(seed), device="cpu", dtype=torch.float16)
    return noise.to(device=device, dtype=dtype)


def invokeai_schedule(steps: int, width: int, height: int, shifted: bool) -> list[float]:
    """steps + 1 times from 1 to 0; `shifted` (dev, not schnell) moves them toward 1 by the resolution-dependent mu
    of FluxPipeline's scheduler config (the values are the pipeline's sigmas, and its terminal 0)."""
    if steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {steps}")
    times = torch.linspace(1, 0, steps + 1)
    if shifted:
        tokens = (height // SIZE_MULTIPLE) * (width // SIZE_MULTIPLE)
        scale = math.exp(image_shift(tokens, SHIFT_DEFAULTS))
        times = scale / (scale + (1 / times - 1))  # at t = 0: 1/0 is inf, and the time stays 0
    return [float(t) for t in times.tolist()]


def clip_schedule(schedule: Sequence[float], start: float, end: float) -> list[float]:
    """The part of a schedule (decreasing from 1 to 0) between 1 - start and 1 - end: from the last time at or
    above 1 - start, which becomes exactly 1 - start, to the last time at or above 1 - end, with 1 - end added when
    that one is above it. A time within 1e-6 of a bound counts as on it."""
    if not 0.0 <= start <= end <= 1.0:
        raise ValueError(f"denoising_start ({start}) must be at most denoising_end ({end}), both within [0, 1]")
    eps = 1e-6
    top, bottom = 1.0 - start, 1.0 - end

    def last_at_least(bound: float) -> int:
        return sum(1 for t in schedule if t >= bound - eps) - 1

    clipped = list(schedule[last_at_least(top) : last_at_least(bottom) + 1])
    clipped[0] = top
    if clipped[-1] > bottom + eps:
        clipped.append(bottom)
    return clipped


def cfg_schedule(cfg_scale: float | Sequence[float], steps: int, start_step: int, end_step: int) -> list[float]:
    """The classifier-free guidance scale of each step: `cfg_scale` (one value, or one per step) from `start_step`
    to `end_step` (negative: counted from the last step), 1 (none) elsewhere."""
    scales = [float(cfg_scale)] * steps if isinstance(cfg_scale, (int, float)) else [float(v) for v in cfg_scale]
    if len(scales) != steps:
        raise ValueError(f"cfg_scale has {len(scales)} values; the schedule runs {steps} steps, one value each")
    first = start_step + steps if start_step < 0 else start_step
    last = end_step + steps if end_step < 0 else end_step
    if not 0 <= first < steps:
        raise ValueError(f"cfg_scale_start_step {start_step} is outside the {steps} steps")
    if not 0 <= last < steps:
        raise ValueError(f"cfg_scale_end_step {end_step} is outside the {steps} steps")
    if first > last:
        raise ValueError(f"cfg_scale_start_step ({start_step}) must not come after cfg_scale_end_step ({end_step})")
    return [scale if first <= i <= last else 1.0 for i, scale in enumerate(scales)]


def _sampler(name: str, schedule: Sequence[float], device: torch.device) -> Any:
    """The scheduler InvokeAI samples with: built on diffusers' default config (no shift of its own); Euler on the
    given schedule, Heun and LCM on their own schedule of as many steps (they take no sigmas)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FlowMatchHeunDiscreteScheduler, FlowMatchLCMScheduler

    if name == "euler":
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000)
        scheduler.set_timesteps(sigmas=list(schedule), device=device)
        return scheduler
    classes = {"heun": FlowMatchHeunDiscreteScheduler, "lcm": FlowMatchLCMScheduler}
    if name not in classes:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(SAMPLERS)}")
    scheduler = classes[name](num_train_timesteps=1000)
    scheduler.set_timesteps(num_inference_steps=len(schedule) - 1, device=device)
    return scheduler


@torch.inference_mode()
def denoise_invokeai(
    transformer: Any,
    *,
    positive: Prompt,
    negative: Prompt | None,
    width: int,
    height: int,
    steps: int,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
    scheduler: str = "euler",
    guidance: float = 4.0,
    cfg_scale: float | Sequence[float] = 1.0,
    cfg_scale_start_step: int = 0,
    cfg_scale_end_step: int = -1,
    init_latents: torch.Tensor | None = None,
    denoising_start: float = 0.0,
    denoising_end: float = 1.0,
    add_noise: bool = True,
    on_step: StepCallback | None = None,
) -> torch.Tensor:
    """Latents (1, 16, height/8, width/8) as InvokeAI's flux_denoise makes them.

    Text-to-image starts from `invokeai_noise`; image-to-image from `init_latents` blended with it at the first
    time (1 - denoising_start), or from the latents as they are without `add_noise`. The schedule is shifted when
    the transformer is guidance-distilled (dev; InvokeAI: any variant but schnell). `on_step(step, total,
    latents)` gets the unpacked latents after each of the `total` steps of the cut schedule.
    """
    check_size(width, height)
    device = torch.device(device)
    shape = (1, LATENT_CHANNELS, height // LATENT_SCALE, width // LATENT_SCALE)
    if init_latents is not None and tuple(init_latents.shape) != shape:
        raise ValueError(f"the latents have shape {tuple(init_latents.shape)}; {width}x{height} needs {shape}")
    if init_latents is None and denoising_start > 1e-5:
        raise ValueError("denoising_start must be 0 without latents to start from (text-to-image)")
    shifted = bool(transformer.config.guidance_embeds)
    schedule = clip_schedule(invokeai_schedule(steps, width, height, shifted), denoising_start, denoising_end)
    if init_latents is None:
        start = invokeai_noise(width, height, seed, device, dtype)
    elif add_noise:
        first = schedule[0]
        noise = invokeai_noise(width, height, seed, device, dtype)
        start = first * noise + (1.0 - first) * init_latents.to(device=device, dtype=dtype)
    else:
        start = init_latents.to(device=device, dtype=dtype)
    total = len(schedule) - 1
    if total < 1:
        return start  # denoising_start == denoising_end: only the noising, no step
    scales = cfg_schedule(cfg_scale, total, cfg_scale_start_step, cfg_scale_end_step)
    sampler = _sampler(scheduler, schedule, device)
    latents = pack_latents(start)
    grid = (shape[2] // PATCH, shape[3] // PATCH)
    velocity = _Velocity(transformer, positive, negative, grid, guidance, device, dtype)
    # InvokeAI samples LCM without a generator (a new image every run); here its step noise is seeded, as
    # InvokeAI seeds SD's stochastic samplers.
    extra = {"generator": seeded_generator(seed ^ STOCHASTIC_SEED_MASK)} if scheduler == "lcm" else {}
    timesteps, sigmas, done = sampler.timesteps, sampler.sigmas, 0
    for index, t in enumerate(timesteps):
        if index == len(timesteps) - 1 and float(sigmas[index + 1]) == float(sigmas[index]):
            break  # InvokeAI's Euler runs a last step from 0 to 0, which leaves the latents as they are
        completes = not getattr(sampler, "state_in_first_order", False)  # Heun: its second evaluation ends a step
        output = velocity(latents, t, scales[min(done, total - 1)])
        latents = sampler.step(output, t, latents, return_dict=False, **extra)[0]
        if (completes or index == len(timesteps) - 1) and done < total:
            done += 1
            if on_step is not None:
                on_step(done, total, unpack_latents(latents, height, width))
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
