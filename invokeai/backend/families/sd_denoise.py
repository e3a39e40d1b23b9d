"""The denoise loop the Stable Diffusion families (SD-1, SDXL) share, and its two ways to start.

One loop runs the UNet with classifier-free guidance and steps the scheduler; what differs between this server's own
nodes and InvokeAI's `denoise_latents` is only where it starts:

- `pipeline_start`: what diffusers' StableDiffusion(XL)(Img2Img)Pipeline does: noise drawn from the seed's CPU
  generator and scaled by `init_noise_sigma` (text-to-image), or the img2img pipeline's `strength` tail of the
  schedule with its noise drawn after the VAE's posterior sample; the scheduler steps with that same generator.
- `invokeai_start`: what InvokeAI's `denoise_latents` does with a noise tensor (its `noise` node's), latents and
  `denoising_start`/`denoising_end`: the timesteps whose values fall in that range, the latents noised to the first
  of them with `scheduler.add_noise`, and a step generator seeded with `seed ^ 0xFFFFFFFF` on the device.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from invokeai.backend.families.sd_schedulers import img2img_timesteps, step_kwargs
from invokeai.backend.generation.steps import StepCallback, seeded_noise

# InvokeAI seeds the scheduler's step generator (the stochastic samplers' noise) with the seed's bits flipped.
STEP_SEED_MASK = 0xFFFFFFFF


@dataclass
class DenoiseStart:
    """Where a run starts: the (already noised) latents, the timesteps to run and scheduler.step's extra arguments.
    No timesteps: the latents are returned as they are."""

    latents: torch.Tensor
    timesteps: torch.Tensor
    step_kwargs: dict[str, Any] = field(default_factory=dict)


def pipeline_start(
    scheduler: Any,
    *,
    shape: tuple[int, ...],
    steps: int,
    generator: torch.Generator,
    device: torch.device,
    dtype: torch.dtype,
    init_latents: torch.Tensor | None,
    strength: float,
    begin_at_zero: bool = False,
    require_steps: bool = False,
) -> DenoiseStart:
    """The start diffusers' SD pipelines make (see the module's docstring). `begin_at_zero`: tell the scheduler the
    text-to-image run begins at index 0 (the SDXL pipeline does). `require_steps`: refuse a strength that keeps no
    step (SDXL's nodes do; SD-1's return the noised latents, as they always have)."""
    scheduler.set_timesteps(steps, device=device)
    if init_latents is None:
        timesteps = scheduler.timesteps
        latents = seeded_noise(shape, generator, device, dtype) * scheduler.init_noise_sigma
        if begin_at_zero and hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(0)
    else:
        if tuple(init_latents.shape) != shape:
            raise ValueError(f"init_latents have shape {tuple(init_latents.shape)}; the size needs {shape}")
        timesteps = img2img_timesteps(scheduler, steps, strength)
        if require_steps and len(timesteps) == 0:
            raise ValueError(f"strength {strength} keeps none of the {steps} steps; raise the strength or the steps")
        # The img2img pipeline drew the VAE posterior sample (vae_encode) from this same generator first; its noise
        # is the generator's next draw.
        seeded_noise(shape, generator, "cpu", dtype)
        noise = seeded_noise(shape, generator, device, dtype)
        latents = scheduler.add_noise(init_latents.to(device=device, dtype=dtype), noise, timesteps[:1].repeat(1))
    return DenoiseStart(latents, timesteps, step_kwargs(scheduler, generator))


def invokeai_timesteps(
    scheduler: Any, steps: int, denoising_start: float, denoising_end: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(timesteps to run, the timestep the latents are noised to (none past the end), its index in the schedule):
    InvokeAI's cut of the schedule, by timestep value. The run
    starts at the first timestep at most num_train_timesteps * (1 - denoising_start) and ends before the first below
    num_train_timesteps * (1 - denoising_end), counted in whole solver steps (a second-order scheduler's pairs)."""
    if not 0.0 <= denoising_start <= 1.0 or not 0.0 <= denoising_end <= 1.0:
        raise ValueError(
            f"denoising_start and denoising_end must be within [0, 1], got {denoising_start} and {denoising_end}"
        )
    scheduler.set_timesteps(steps, device=device)
    timesteps = scheduler.timesteps
    order = scheduler.order
    whole = timesteps[::order]
    train = scheduler.config["num_train_timesteps"]
    start_value = round(train * (1 - denoising_start))
    end_value = round(train * (1 - denoising_end))
    start = int((whole >= start_value).sum())
    end = int((whole[start:] >= end_value).sum())
    start, end = start * order, end * order
    return timesteps[start : start + end], timesteps[start : start + 1], start


def invokeai_step_kwargs(scheduler: Any, seed: int, device: torch.device) -> dict[str, Any]:
    """scheduler.step's extra arguments as InvokeAI passes them: a generator seeded with seed ^ 0xFFFFFFFF on the
    device where step takes one, and TCD's eta 1."""
    accepted = inspect.signature(scheduler.step).parameters
    kwargs: dict[str, Any] = {}
    if "generator" in accepted:
        kwargs["generator"] = torch.Generator(device=device).manual_seed(seed ^ STEP_SEED_MASK)
    if type(scheduler).__name__ == "TCDScheduler":
        kwargs["eta"] = 1.0
    return kwargs


def invokeai_start(
    scheduler: Any,
    *,
    steps: int,
    denoising_start: float,
    denoising_end: float,
    noise: torch.Tensor | None,
    latents: torch.Tensor | None,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
) -> DenoiseStart:
    """The start InvokeAI's denoise_latents makes (see the module's docstring).

    `latents` None is text-to-image (InvokeAI starts from zeros). From the very start of the schedule it starts as
    the diffusers pipeline does, the noise times `init_noise_sigma`, which is the same image within 1/255 as
    InvokeAI's zeros noised by `add_noise` (its schedulers' first sigma) and the same image as this server's own
    text-to-image node for the same noise. `noise` None: the latents are taken as already noised (InvokeAI's SDXL
    refiner pass)."""
    if noise is None and latents is None:
        raise ValueError("denoise_latents needs noise or latents (or both)")
    if noise is not None and latents is not None and noise.shape[1:] != latents.shape[1:]:
        raise ValueError(
            f"the noise {tuple(noise.shape)} and the latents {tuple(latents.shape)} are of different sizes; give the "
            "noise node the latents' width and height"
        )
    timesteps, first, index = invokeai_timesteps(scheduler, steps, denoising_start, denoising_end, device)
    kwargs = invokeai_step_kwargs(scheduler, seed, device)
    base = latents if latents is not None else torch.zeros_like(noise)  # type: ignore[arg-type]
    base = base.to(device=device, dtype=dtype)
    if noise is None or len(first) == 0:
        # Latents already noised, or a start past the schedule's end (InvokeAI returns the latents as given).
        return DenoiseStart(base, timesteps, kwargs)
    noise = noise.to(device=device, dtype=dtype)
    if latents is None and index == 0:
        return DenoiseStart(noise * scheduler.init_noise_sigma, timesteps, kwargs)
    return DenoiseStart(scheduler.add_noise(base, noise, first.expand(base.shape[0])), timesteps, kwargs)


def guidance_pair(negative: torch.Tensor, positive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The negative and positive text embeddings as one UNet batch, and the attention mask that batch needs: none
    when they are of one length, else the shorter padded with zeros that the mask hides (as InvokeAI batches a
    negative and a positive of different token counts, e.g. several prompts collected into one)."""
    if negative.shape[1] == positive.shape[1]:
        return torch.cat([negative, positive]), None
    length = max(negative.shape[1], positive.shape[1])
    padded, masks = [], []
    for embeds in (negative, positive):
        missing = length - embeds.shape[1]
        mask = torch.ones(embeds.shape[0], length, device=embeds.device, dtype=embeds.dtype)
        if missing:
            zeros = torch.zeros(embeds.shape[0], missing, embeds.shape[2], device=embeds.device, dtype=embeds.dtype)
            embeds = torch.cat([embeds, zeros], dim=1)
            mask[:, length - missing :] = 0
        padded.append(embeds)
        masks.append(mask)
    return torch.cat(padded), torch.cat(masks)


def rescale_guidance(guided: torch.Tensor, positive: torch.Tensor, multiplier: float) -> torch.Tensor:
    """CFG rescale (Lin et al. 2023, algorithm 2), as InvokeAI's cfg_rescale_multiplier applies it: the guided
    prediction scaled to the positive prediction's standard deviation, mixed by `multiplier`."""
    dims = tuple(range(1, guided.ndim))
    rescaled = guided * (positive.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True))
    return multiplier * rescaled + (1.0 - multiplier) * guided


@dataclass(frozen=True)
class Guidance:
    """What the loop conditions the UNet on. `negative` None: no guidance (only the positive prediction).
    `unet_kwargs(guided)` gives the family's extra UNet arguments (SDXL's added conditions) for a guided batch of
    two or a single one. `cfg_scale` may give a scale per step run."""

    positive: torch.Tensor
    negative: torch.Tensor | None
    cfg_scale: float | Sequence[float]
    rescale: float = 0.0
    unet_kwargs: Callable[[bool], dict[str, Any]] = lambda guided: {}

    def scale(self, index: int) -> float:
        if isinstance(self.cfg_scale, int | float):
            return float(self.cfg_scale)
        return float(self.cfg_scale[index])


@torch.inference_mode()
def run(
    unet: Any, scheduler: Any, start: DenoiseStart, guidance: Guidance, on_step: StepCallback | None
) -> torch.Tensor:
    """The denoise loop: for each timestep, the UNet's prediction (the negative and positive batched under
    guidance), guided, optionally rescaled, and a scheduler step. `on_step(step, total, latents)` after each."""
    latents = start.latents
    guided = guidance.negative is not None
    mask = None
    if guided:
        assert guidance.negative is not None
        embeds, mask = guidance_pair(guidance.negative, guidance.positive)
    else:
        embeds = guidance.positive
    extra = guidance.unet_kwargs(guided)
    if mask is not None:
        extra = {**extra, "encoder_attention_mask": mask}
    total = len(start.timesteps)
    for index, t in enumerate(start.timesteps):
        model_input = torch.cat([latents] * 2) if guided else latents
        model_input = scheduler.scale_model_input(model_input, t)
        noise_pred = unet(model_input, t, encoder_hidden_states=embeds, return_dict=False, **extra)[0]
        if guided:
            uncond, cond = noise_pred.chunk(2)
            noise_pred = uncond + guidance.scale(index) * (cond - uncond)
            if guidance.rescale > 0:
                noise_pred = rescale_guidance(noise_pred, cond, guidance.rescale)
        latents = scheduler.step(noise_pred, t, latents, **start.step_kwargs, return_dict=False)[0]
        if on_step is not None:
            on_step(index + 1, total, latents)
    return latents
