"""The scheduler names InvokeAI users pick for the Stable Diffusion families (SD-1, SD-2, SDXL).

Each name is a diffusers scheduler class plus the options InvokeAI sets for it, built on the model's own noise
schedule (its scheduler config: betas, offsets, prediction type), so a name samples exactly as diffusers does when a
user switches a pipeline to that class with those options. Also here: how the SD pipelines drive a scheduler (the
extra step arguments, the image-to-image start), which the SD families' denoise loops share.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SchedulerChoice:
    """A user-facing scheduler name: the diffusers class (by name) and the options it is built with."""

    name: str
    class_name: str
    options: Mapping[str, Any] = field(default_factory=dict)


_KARRAS = {"use_karras_sigmas": True}
_NO_KARRAS = {"use_karras_sigmas": False}
_SDE = {"algorithm_type": "sde-dpmsolver++"}
# DPMSolverSDEScheduler draws its Brownian noise from its own seed, not the run's generator; InvokeAI fixes it so
# that one seed gives one image.
_SDE_SEED = {"noise_sampler_seed": 0}

_CHOICES = (
    SchedulerChoice("euler", "EulerDiscreteScheduler", _NO_KARRAS),
    SchedulerChoice("euler_a", "EulerAncestralDiscreteScheduler"),
    SchedulerChoice("euler_k", "EulerDiscreteScheduler", _KARRAS),
    SchedulerChoice("ddim", "DDIMScheduler"),
    SchedulerChoice("ddpm", "DDPMScheduler"),
    SchedulerChoice("deis", "DEISMultistepScheduler", _NO_KARRAS),
    SchedulerChoice("deis_k", "DEISMultistepScheduler", _KARRAS),
    SchedulerChoice("lms", "LMSDiscreteScheduler", _NO_KARRAS),
    SchedulerChoice("lms_k", "LMSDiscreteScheduler", _KARRAS),
    SchedulerChoice("heun", "HeunDiscreteScheduler", _NO_KARRAS),
    SchedulerChoice("heun_k", "HeunDiscreteScheduler", _KARRAS),
    SchedulerChoice("pndm", "PNDMScheduler"),
    SchedulerChoice("kdpm_2", "KDPM2DiscreteScheduler", _NO_KARRAS),
    SchedulerChoice("kdpm_2_k", "KDPM2DiscreteScheduler", _KARRAS),
    SchedulerChoice("kdpm_2_a", "KDPM2AncestralDiscreteScheduler", _NO_KARRAS),
    SchedulerChoice("kdpm_2_a_k", "KDPM2AncestralDiscreteScheduler", _KARRAS),
    SchedulerChoice("dpmpp_2s", "DPMSolverSinglestepScheduler", {**_NO_KARRAS, "solver_order": 2}),
    SchedulerChoice("dpmpp_2s_k", "DPMSolverSinglestepScheduler", {**_KARRAS, "solver_order": 2}),
    SchedulerChoice("dpmpp_2m", "DPMSolverMultistepScheduler", {**_NO_KARRAS, "solver_order": 2}),
    SchedulerChoice("dpmpp_2m_k", "DPMSolverMultistepScheduler", {**_KARRAS, "solver_order": 2}),
    SchedulerChoice("dpmpp_2m_sde", "DPMSolverMultistepScheduler", {**_NO_KARRAS, "solver_order": 2, **_SDE}),
    SchedulerChoice("dpmpp_2m_sde_k", "DPMSolverMultistepScheduler", {**_KARRAS, "solver_order": 2, **_SDE}),
    SchedulerChoice("dpmpp_3m", "DPMSolverMultistepScheduler", {**_NO_KARRAS, "solver_order": 3}),
    SchedulerChoice("dpmpp_3m_k", "DPMSolverMultistepScheduler", {**_KARRAS, "solver_order": 3}),
    SchedulerChoice("dpmpp_sde", "DPMSolverSDEScheduler", {**_NO_KARRAS, **_SDE_SEED}),
    SchedulerChoice("dpmpp_sde_k", "DPMSolverSDEScheduler", {**_KARRAS, **_SDE_SEED}),
    SchedulerChoice("unipc", "UniPCMultistepScheduler"),
    SchedulerChoice("unipc_k", "UniPCMultistepScheduler", _KARRAS),
    SchedulerChoice("lcm", "LCMScheduler"),
    SchedulerChoice("tcd", "TCDScheduler"),
)

SD_SCHEDULERS: Mapping[str, SchedulerChoice] = {choice.name: choice for choice in _CHOICES}
SD_SCHEDULER_NAMES: tuple[str, ...] = tuple(SD_SCHEDULERS)
# The names as a type for node fields, built from the table so that they are declared once; pydantic (and the
# OpenAPI enum) read the values at runtime, which static checkers cannot follow.
SDSchedulerName = Literal[SD_SCHEDULER_NAMES]  # type: ignore[valid-type]


def scheduler_choice(name: str) -> SchedulerChoice:
    """The class and options of `name`; an unknown name raises ValueError listing the known ones."""
    try:
        return SD_SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(SD_SCHEDULER_NAMES)}") from None


def make_sd_scheduler(name: str, base_config: Mapping[str, Any], **overrides: Any) -> Any:
    """A new scheduler `name` on the model's own noise schedule, from its scheduler config `base_config`.

    It equals diffusers' `cls.from_config({**base_config, **options})`, with one difference: where `base_config` is
    a loaded scheduler's and lists an option's key under `_use_default_values` (say use_karras_sigmas, absent from
    an older Euler file), merging would let from_config drop the option again; passed as from_config's keyword
    arguments, as diffusers documents switching schedulers, the option always holds. Keys the class does not know
    (PNDM's skip_prk_steps, say) are dropped by from_config. `overrides` are set over the name's options (InvokeAI's
    denoise_latents seeds dpmpp_sde's Brownian noise with the run's seed).
    """
    import diffusers

    from invokeai.backend.models.schedulers import new_scheduler

    choice = scheduler_choice(name)
    return new_scheduler(getattr(diffusers, choice.class_name), dict(base_config), **{**choice.options, **overrides})


def step_kwargs(scheduler: Any, generator: torch.Generator) -> dict[str, Any]:
    """The SD pipelines' extra scheduler.step arguments: eta 0 where accepted (DDIM), the generator where accepted."""
    accepted = inspect.signature(scheduler.step).parameters
    kwargs: dict[str, Any] = {}
    if "eta" in accepted:
        kwargs["eta"] = 0.0
    if "generator" in accepted:
        kwargs["generator"] = generator
    return kwargs


def img2img_timesteps(scheduler: Any, steps: int, strength: float) -> torch.Tensor:
    """The tail of the schedule that `strength` keeps, with the scheduler told where it begins (as the SD img2img
    pipelines do without denoising_start, so index-based schedulers add noise and step from the right sigma)."""
    kept = min(int(steps * strength), steps)
    start = max(steps - kept, 0) * scheduler.order
    if hasattr(scheduler, "set_begin_index"):
        scheduler.set_begin_index(start)
    return scheduler.timesteps[start:]
