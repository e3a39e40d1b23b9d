"""Each family's samplers, built on the model's own noise schedule from a shipped scheduler config."""

from __future__ import annotations

import pytest

from invokeai.backend.models import krea2, sd1
from invokeai.backend.models.config_variants import get_variant


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
