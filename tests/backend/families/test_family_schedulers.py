"""Each family's samplers, built on the model's own noise schedule from a shipped scheduler config."""

from __future__ import annotations

import pytest
import torch

from invokeai.backend.families import config_variant
from invokeai.backend.families.krea2.descriptor import FAMILY as krea2
from invokeai.backend.families.sd1.descriptor import FAMILY as sd1
from invokeai.backend.models.schedulers import new_scheduler


@pytest.mark.parametrize(
    ("name", "class_name"),
    [("euler", "EulerDiscreteScheduler"), ("ddim", "DDIMScheduler"), ("dpmpp_2m", "DPMSolverMultistepScheduler")],
)
def test_sd1_schedulers_keep_the_models_noise_schedule(name: str, class_name: str) -> None:
    base = config_variant("sd-1").component_config("scheduler")
    scheduler = sd1.make_scheduler(name, base)
    assert type(scheduler).__name__ == class_name
    assert (scheduler.config.beta_schedule, scheduler.config.beta_start, scheduler.config.beta_end) == (
        "scaled_linear",
        0.00085,
        0.012,
    )
    scheduler.set_timesteps(10)
    assert len(scheduler.timesteps) == 10
    if name == "dpmpp_2m":
        assert (scheduler.config.algorithm_type, scheduler.config.solver_order) == ("dpmsolver++", 2)


def test_krea2_scheduler_shifts_with_resolution() -> None:
    scheduler = krea2.make_scheduler("euler", config_variant("krea2").component_config("scheduler"))
    assert type(scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    scheduler.set_timesteps(4, mu=0.5)
    small = scheduler.sigmas.clone()
    scheduler.set_timesteps(4, mu=1.15)
    assert (scheduler.sigmas[1:-1] > small[1:-1]).all()


@pytest.mark.parametrize("family", [sd1, krea2], ids=["sd-1", "krea2"])
def test_unknown_scheduler_is_refused(family: object) -> None:
    with pytest.raises(ValueError, match="unknown scheduler 'no_such_scheduler'"):
        family.make_scheduler("no_such_scheduler", {})


def test_each_new_scheduler_is_a_separate_unused_one() -> None:
    from diffusers import DPMSolverMultistepScheduler

    base = config_variant("sd-1").component_config("scheduler")
    first = sd1.make_scheduler("dpmpp_2m", base)
    first.set_timesteps(10)
    second = sd1.make_scheduler("dpmpp_2m", base)
    assert second is not first and second.num_inference_steps is None
    assert second.betas is not first.betas
    built = DPMSolverMultistepScheduler.from_config(base, use_karras_sigmas=False, solver_order=2)
    assert dict(second.config) == dict(built.config)
    assert torch.equal(second.alphas_cumprod, built.alphas_cumprod)


def test_a_different_config_gets_its_own_scheduler() -> None:
    from diffusers import EulerDiscreteScheduler

    base = config_variant("sd-1").component_config("scheduler")
    linear = new_scheduler(EulerDiscreteScheduler, {**base, "beta_schedule": "linear"})
    scaled = new_scheduler(EulerDiscreteScheduler, base)
    assert (linear.config.beta_schedule, scaled.config.beta_schedule) == ("linear", "scaled_linear")
    assert not torch.equal(linear.betas, scaled.betas)


def _diffusers_sd1(name: str, config: dict) -> object:
    """What a diffusers user gets switching an SD-1.5 pipeline's scheduler to `name`."""
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler

    # InvokeAI's options for these names (tests/backend/families/test_sd_schedulers.py has them all).
    if name == "dpmpp_2m":
        return DPMSolverMultistepScheduler.from_config(config, use_karras_sigmas=False, solver_order=2)
    if name == "euler":
        return EulerDiscreteScheduler.from_config(config, use_karras_sigmas=False)
    return DDIMScheduler.from_config(config)


def _sd1_configs() -> dict[str, dict]:
    """Scheduler configs SD-1.5 checkpoints come with: the PNDM one of diffusers 0.6.0 (the shipped sd-1 config, no
    timestep_spacing), that config as a loaded PNDMScheduler holds it (defaults filled in and listed under
    _use_default_values), one older than steps_offset, and recent DDIM and Euler ones."""
    from diffusers import EulerDiscreteScheduler, PNDMScheduler

    shipped = config_variant("sd-1").component_config("scheduler")
    loaded = dict(PNDMScheduler.from_pretrained(config_variant("sd-1").path, subfolder="scheduler").config)
    older = {key: value for key, value in shipped.items() if key != "steps_offset"}
    euler = dict(EulerDiscreteScheduler.from_config(shipped, timestep_spacing="trailing").config)
    return {
        "PNDM 0.6.0 file": shipped,
        "PNDM loaded": loaded,
        "older than steps_offset": older,
        "recent DDIM": config_variant("sd-1-demo").component_config("scheduler"),
        "recent Euler, trailing": euler,
    }


@pytest.mark.parametrize("config_name", list(_sd1_configs()))
# Every other SD scheduler name: tests/backend/families/test_sd_schedulers.py.
@pytest.mark.parametrize("name", ["euler", "ddim", "dpmpp_2m"])
def test_sd1_schedulers_equal_diffusers_from_config(name: str, config_name: str) -> None:
    config = _sd1_configs()[config_name]
    ours, theirs = sd1.make_scheduler(name, config), _diffusers_sd1(name, config)
    assert type(ours) is type(theirs)
    assert dict(ours.config) == dict(theirs.config)
    for scheduler in (ours, theirs):
        scheduler.set_timesteps(3)
    assert torch.equal(ours.timesteps, theirs.timesteps), (ours.timesteps, theirs.timesteps)
    if hasattr(theirs, "sigmas"):
        assert torch.equal(ours.sigmas, theirs.sigmas)


def test_a_pndm_era_config_keeps_eulers_own_timestep_spacing() -> None:
    # The classic SD-1.5 config has no timestep_spacing; PNDM's default ("leading") must not be forced onto Euler.
    from diffusers import PNDMScheduler

    loaded = dict(PNDMScheduler.from_pretrained(config_variant("sd-1").path, subfolder="scheduler").config)
    assert loaded["timestep_spacing"] == "leading" and "timestep_spacing" in loaded["_use_default_values"]
    assert sd1.make_scheduler("euler", loaded).config.timestep_spacing == "linspace"
    assert sd1.make_scheduler("dpmpp_2m", loaded).config.timestep_spacing == "linspace"


def test_krea2_scheduler_equals_diffusers_from_config() -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    config = config_variant("krea2").component_config("scheduler")
    ours, theirs = krea2.make_scheduler("euler", config), FlowMatchEulerDiscreteScheduler.from_config(config)
    assert dict(ours.config) == dict(theirs.config)
    ours.set_timesteps(4, mu=0.8)
    theirs.set_timesteps(4, mu=0.8)
    assert torch.equal(ours.sigmas, theirs.sigmas)
