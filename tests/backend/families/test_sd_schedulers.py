"""The SD scheduler names against diffusers: each name builds diffusers' own class with InvokeAI's options for it, on
the model's noise schedule, and samples as the stock pipeline does with that scheduler."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from invokeai.backend.families import config_variant
from invokeai.backend.families.sd_schedulers import SD_SCHEDULER_NAMES, make_sd_scheduler, scheduler_choice

os.environ["HF_HUB_OFFLINE"] = "1"

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

SD15_SCHEDULER = config_variant("sd-1").path / "scheduler" / "scheduler_config.json"
PROMPT = "a photo of a cat"
SIZE = 64
STEPS = 3
# PNDM's Runge-Kutta warm-up (configs without skip_prk_steps, as the demo's) needs 4 steps in diffusers itself.
PNDM_STEPS = 4
CFG = 7.5
SEED = 7

# The names and what they are, written out independently of the module under test: InvokeAI's scheduler map.
EXPECTED = {
    "euler": ("EulerDiscreteScheduler", {"use_karras_sigmas": False}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "euler_k": ("EulerDiscreteScheduler", {"use_karras_sigmas": True}),
    "ddim": ("DDIMScheduler", {}),
    "ddpm": ("DDPMScheduler", {}),
    "deis": ("DEISMultistepScheduler", {"use_karras_sigmas": False}),
    "deis_k": ("DEISMultistepScheduler", {"use_karras_sigmas": True}),
    "lms": ("LMSDiscreteScheduler", {"use_karras_sigmas": False}),
    "lms_k": ("LMSDiscreteScheduler", {"use_karras_sigmas": True}),
    "heun": ("HeunDiscreteScheduler", {"use_karras_sigmas": False}),
    "heun_k": ("HeunDiscreteScheduler", {"use_karras_sigmas": True}),
    "pndm": ("PNDMScheduler", {}),
    "kdpm_2": ("KDPM2DiscreteScheduler", {"use_karras_sigmas": False}),
    "kdpm_2_k": ("KDPM2DiscreteScheduler", {"use_karras_sigmas": True}),
    "kdpm_2_a": ("KDPM2AncestralDiscreteScheduler", {"use_karras_sigmas": False}),
    "kdpm_2_a_k": ("KDPM2AncestralDiscreteScheduler", {"use_karras_sigmas": True}),
    "dpmpp_2s": ("DPMSolverSinglestepScheduler", {"use_karras_sigmas": False, "solver_order": 2}),
    "dpmpp_2s_k": ("DPMSolverSinglestepScheduler", {"use_karras_sigmas": True, "solver_order": 2}),
    "dpmpp_2m": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": False, "solver_order": 2}),
    "dpmpp_2m_k": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True, "solver_order": 2}),
    "dpmpp_2m_sde": (
        "DPMSolverMultistepScheduler",
        {"use_karras_sigmas": False, "solver_order": 2, "algorithm_type": "sde-dpmsolver++"},
    ),
    "dpmpp_2m_sde_k": (
        "DPMSolverMultistepScheduler",
        {"use_karras_sigmas": True, "solver_order": 2, "algorithm_type": "sde-dpmsolver++"},
    ),
    "dpmpp_3m": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": False, "solver_order": 3}),
    "dpmpp_3m_k": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True, "solver_order": 3}),
    "dpmpp_sde": ("DPMSolverSDEScheduler", {"use_karras_sigmas": False, "noise_sampler_seed": 0}),
    "dpmpp_sde_k": ("DPMSolverSDEScheduler", {"use_karras_sigmas": True, "noise_sampler_seed": 0}),
    "unipc": ("UniPCMultistepScheduler", {}),
    "unipc_k": ("UniPCMultistepScheduler", {"use_karras_sigmas": True}),
    "lcm": ("LCMScheduler", {}),
    "tcd": ("TCDScheduler", {}),
}


@pytest.fixture(scope="module")
def demo_pipeline() -> Any:
    """demo-sd1's StableDiffusionPipeline (tiny real components, seeded random weights), built once here."""
    from invokeai.backend.families.sd1.demo import build_sd1_pipeline

    pipe = build_sd1_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _configs(demo_pipeline: Any) -> dict[str, dict[str, Any]]:
    """Scheduler configs SD models come with: the classic SD-1.5 PNDM file as shipped (no timestep_spacing), that file
    as a loaded PNDMScheduler holds it (defaults listed under `_use_default_values`), one older than steps_offset, a
    recent Euler one with trailing spacing, and the demo model's own (a recent DDIM one)."""
    from diffusers import EulerDiscreteScheduler, PNDMScheduler

    shipped = json.loads(SD15_SCHEDULER.read_text())
    return {
        "sd-1.5 file": shipped,
        "sd-1.5 loaded": dict(PNDMScheduler.from_pretrained(SD15_SCHEDULER.parent).config),
        "older than steps_offset": {key: value for key, value in shipped.items() if key != "steps_offset"},
        "euler, trailing": dict(EulerDiscreteScheduler.from_config(shipped, timestep_spacing="trailing").config),
        "demo": dict(demo_pipeline.scheduler.config),
    }


def _steps(name: str) -> int:
    return PNDM_STEPS if name == "pndm" else STEPS


def _diffusers(name: str, config: dict[str, Any]) -> Any:
    """The scheduler as InvokeAI and a diffusers user build it: `from_config({**config, **options})`. Where the config
    is a loaded one listing an option's key under `_use_default_values` (the "euler, trailing" one lists
    use_karras_sigmas), from_config would drop the option again; the name means the option, so it is taken off that
    list, which is what diffusers' own `from_config(config, **options)` does."""
    import diffusers

    cls, options = EXPECTED[name]
    merged = {**config, **options}
    if "_use_default_values" in config:
        merged["_use_default_values"] = [key for key in config["_use_default_values"] if key not in options]
    return getattr(diffusers, cls).from_config(merged)


def _comparable(config: Any) -> dict[str, Any]:
    """A scheduler's config; `_use_default_values` is a list made from a set, so its order is not part of it."""
    return {**dict(config), "_use_default_values": sorted(config.get("_use_default_values", []))}


def test_the_names_are_invokeais_in_order() -> None:
    assert list(EXPECTED) == list(SD_SCHEDULER_NAMES)
    for name, (cls, options) in EXPECTED.items():
        choice = scheduler_choice(name)
        assert (choice.class_name, dict(choice.options)) == (cls, options)


def test_docs_api_md_lists_each_name_with_its_class_and_options() -> None:
    import re

    text = (Path(__file__).parents[3] / "docs" / "api.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| `(\w+Scheduler)` \| ([^|]*)\|$", text, re.M)
    documented = {name: (cls, options.strip().strip("`")) for name, cls, options in rows}
    written = {
        name: (cls, ", ".join(f"{key}={value!r}".replace("'", '"') for key, value in options.items()))
        for name, (cls, options) in EXPECTED.items()
    }
    assert documented == written


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown scheduler 'no_such'") as caught:
        make_sd_scheduler("no_such", {})
    assert all(name in str(caught.value) for name in SD_SCHEDULER_NAMES)


@pytest.mark.parametrize("name", SD_SCHEDULER_NAMES)
def test_each_name_is_diffusers_scheduler_on_the_models_schedule(name: str, demo_pipeline: Any) -> None:
    for label, config in _configs(demo_pipeline).items():
        ours, theirs = make_sd_scheduler(name, config), _diffusers(name, config)
        assert type(ours) is type(theirs), label
        assert _comparable(ours.config) == _comparable(theirs.config), label
        assert ours.config.beta_schedule == "scaled_linear", label
        for scheduler in (ours, theirs):
            scheduler.set_timesteps(_steps(name))
        assert torch.equal(ours.timesteps, theirs.timesteps), (label, ours.timesteps, theirs.timesteps)
        if hasattr(theirs, "sigmas"):
            assert torch.equal(torch.as_tensor(ours.sigmas), torch.as_tensor(theirs.sigmas)), label
        _assert_same_steps(ours, theirs, label)


def _assert_same_steps(ours: Any, theirs: Any, label: str) -> None:
    """A few steps on the same latents and model outputs, each with a generator of the same seed: the same samples
    (stochastic schedulers included)."""
    import inspect

    shape = (1, 4, 8, 8)
    start = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    samples = {}
    for key, scheduler in (("ours", ours), ("theirs", theirs)):
        sample = start * scheduler.init_noise_sigma
        generator = torch.Generator().manual_seed(2)
        takes_generator = "generator" in inspect.signature(scheduler.step).parameters
        for index, t in enumerate(scheduler.timesteps[:4]):
            output = torch.randn(shape, generator=torch.Generator().manual_seed(10 + index))
            scheduler.scale_model_input(sample, t)  # as the pipelines do; some schedulers warn without it
            extra = {"generator": generator} if takes_generator else {}
            sample = scheduler.step(output, t, sample, **extra).prev_sample
        samples[key] = sample
    assert torch.isfinite(samples["ours"]).all(), label
    assert torch.equal(samples["ours"], samples["theirs"]), label


def test_an_option_holds_where_the_config_took_its_key_from_defaults() -> None:
    # A loaded Euler config from a file without use_karras_sigmas lists it under _use_default_values; euler_k must
    # still be Karras (merging the option into that config would let from_config drop it).
    from diffusers import EulerDiscreteScheduler

    base = json.loads(SD15_SCHEDULER.read_text())
    loaded = dict(EulerDiscreteScheduler.from_config(base).config)
    assert "use_karras_sigmas" in loaded["_use_default_values"]
    assert make_sd_scheduler("euler_k", loaded).config.use_karras_sigmas is True
    assert dict(make_sd_scheduler("euler_k", loaded).config) == dict(
        EulerDiscreteScheduler.from_config(loaded, use_karras_sigmas=True).config
    )


def _encode(pipe: Any, prompt: str) -> torch.Tensor:
    from invokeai.backend.families.sd1 import generation as sd1

    return sd1.encode_prompt(pipe.text_encoder, pipe.tokenizer, prompt, "cpu")


@pytest.mark.parametrize("name", SD_SCHEDULER_NAMES)
def test_each_name_gives_the_stock_pipelines_image(name: str, demo_pipeline: Any) -> None:
    from invokeai.backend.families.sd1 import generation as sd1

    base = demo_pipeline.scheduler
    latents = sd1.denoise(
        demo_pipeline.unet,
        make_sd_scheduler(name, dict(base.config)),
        positive=_encode(demo_pipeline, PROMPT),
        negative=_encode(demo_pipeline, ""),
        width=SIZE,
        height=SIZE,
        steps=_steps(name),
        cfg_scale=CFG,
        seed=SEED,
        device="cpu",
        dtype=torch.float32,
    )
    ours = np.asarray(sd1.vae_decode(demo_pipeline.vae, latents), dtype=np.int16)
    try:
        demo_pipeline.scheduler = _diffusers(name, dict(base.config))
        expected = demo_pipeline(
            PROMPT,
            num_inference_steps=_steps(name),
            guidance_scale=CFG,
            generator=torch.Generator("cpu").manual_seed(SEED),
            height=SIZE,
            width=SIZE,
        ).images[0]
    finally:
        demo_pipeline.scheduler = base
    assert np.abs(ours - np.asarray(expected, dtype=np.int16)).max() <= 1


@pytest.mark.parametrize("name", SD_SCHEDULER_NAMES)
def test_each_name_gives_the_stock_image_to_image(name: str, demo_pipeline: Any) -> None:
    # 6 steps at strength 0.6 run the last 3: each scheduler starts mid-schedule, from its own add_noise.
    from diffusers import StableDiffusionImg2ImgPipeline

    from invokeai.backend.families.sd1 import generation as sd1

    base = demo_pipeline.scheduler
    noise = torch.randn(1, 4, SIZE // 8, SIZE // 8, generator=torch.Generator().manual_seed(3))
    init = sd1.vae_decode(demo_pipeline.vae, noise * demo_pipeline.vae.config.scaling_factor)
    latents = sd1.denoise(
        demo_pipeline.unet,
        make_sd_scheduler(name, dict(base.config)),
        positive=_encode(demo_pipeline, PROMPT),
        negative=_encode(demo_pipeline, ""),
        width=SIZE,
        height=SIZE,
        steps=6,
        cfg_scale=CFG,
        seed=SEED,
        device="cpu",
        dtype=torch.float32,
        init_latents=sd1.vae_encode(demo_pipeline.vae, init, SEED),
        strength=0.6,
    )
    ours = np.asarray(sd1.vae_decode(demo_pipeline.vae, latents), dtype=np.int16)
    pipe = StableDiffusionImg2ImgPipeline(
        **{**demo_pipeline.components, "scheduler": _diffusers(name, dict(base.config))}
    )
    pipe.set_progress_bar_config(disable=True)
    expected = pipe(
        PROMPT,
        image=init,
        strength=0.6,
        num_inference_steps=6,
        guidance_scale=CFG,
        generator=torch.Generator("cpu").manual_seed(SEED),
    ).images[0]
    assert np.abs(ours - np.asarray(expected, dtype=np.int16)).max() <= 1
