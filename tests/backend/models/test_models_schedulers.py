"""Each family's samplers, built on the model's own noise schedule from a shipped scheduler config."""

from __future__ import annotations

import pytest
import torch

from invokeai.backend.models import krea2, sd1
from invokeai.backend.models.config_variants import get_variant
from invokeai.backend.models.schedulers import new_scheduler


@pytest.mark.parametrize(
    ("name", "class_name"),
    [("euler", "EulerDiscreteScheduler"), ("ddim", "DDIMScheduler"), ("dpmpp_2m", "DPMSolverMultistepScheduler")],
)
def test_sd1_schedulers_keep_the_models_noise_schedule(name: str, class_name: str) -> None:
    base = get_variant("sd-1").component_config("scheduler")
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
    scheduler = krea2.make_scheduler("euler", get_variant("krea2").component_config("scheduler"))
    assert type(scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    scheduler.set_timesteps(4, mu=0.5)
    small = scheduler.sigmas.clone()
    scheduler.set_timesteps(4, mu=1.15)
    assert (scheduler.sigmas[1:-1] > small[1:-1]).all()


@pytest.mark.parametrize("family", [sd1, krea2])
def test_unknown_scheduler_is_refused(family: object) -> None:
    with pytest.raises(ValueError, match="unknown scheduler 'lms'"):
        family.make_scheduler("lms", {})


def test_each_new_scheduler_is_a_separate_unused_one() -> None:
    from diffusers import DPMSolverMultistepScheduler

    base = get_variant("sd-1").component_config("scheduler")
    first = sd1.make_scheduler("dpmpp_2m", base)
    first.set_timesteps(10)
    second = sd1.make_scheduler("dpmpp_2m", base)
    assert second is not first and second.num_inference_steps is None
    assert second.betas is not first.betas
    built = DPMSolverMultistepScheduler.from_config(
        {k: v for k, v in base.items() if not k.startswith("_")}, algorithm_type="dpmsolver++", solver_order=2
    )
    assert dict(second.config) == dict(built.config)
    assert torch.equal(second.alphas_cumprod, built.alphas_cumprod)


def test_a_different_config_gets_its_own_scheduler() -> None:
    from diffusers import EulerDiscreteScheduler

    base = get_variant("sd-1").component_config("scheduler")
    linear = new_scheduler(EulerDiscreteScheduler, {**base, "beta_schedule": "linear"})
    scaled = new_scheduler(EulerDiscreteScheduler, base)
    assert (linear.config.beta_schedule, scaled.config.beta_schedule) == ("linear", "scaled_linear")
    assert not torch.equal(linear.betas, scaled.betas)
