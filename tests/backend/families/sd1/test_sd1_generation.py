"""SD-1 generation steps against diffusers' own pipelines: same components, prompt, seed, scheduler, steps and size
give the same image (within 1/255 per pixel)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from invokeai.backend.families.sd1 import generation as sd1
from invokeai.backend.families.sd1.descriptor import FAMILY as sd1_family
from invokeai.backend.generation.preview import PREVIEW_MAX_SIZE, rgb_preview

os.environ["HF_HUB_OFFLINE"] = "1"

PROMPT = "a photo of a cat"
SEED = 42
STEPS = 4
CFG = 7.5
SIZE = 64
# Text-to-image of every SD scheduler name is checked in tests/backend/families/test_sd_schedulers.py.
PARITY_SCHEDULERS = ("euler", "ddim", "dpmpp_2m")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="session")
def sd1_parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """demo-sd1, built once per session and loaded with load_component."""
    from invokeai.backend.models.demo import build_demo_models
    from invokeai.backend.models.loaders import components_of, load_component
    from invokeai.backend.models.probe import probe_model

    (model,) = build_demo_models(tmp_path_factory.mktemp("generation-sd1"), names=("demo-sd1",))
    probe = probe_model(model.path)
    return {name: load_component(probe, name) for name in components_of(probe)}


@pytest.fixture(scope="session", params=["demo scheduler", "PNDM-era scheduler"])
def parity_parts(request: pytest.FixtureRequest, sd1_parts: dict[str, Any]) -> dict[str, Any]:
    """The demo's components with its own (recent DDIM) scheduler, or with the PNDM scheduler config that classic
    SD-1.5 checkpoints ship (diffusers 0.6.0, no timestep_spacing), as the shipped sd-1 config has it."""
    if request.param == "demo scheduler":
        return sd1_parts
    from diffusers import PNDMScheduler

    from invokeai.backend.families import config_variant

    pndm = PNDMScheduler.from_pretrained(config_variant("sd-1").path, subfolder="scheduler")
    return {**sd1_parts, "scheduler": pndm}


def _scheduler(parts: dict[str, Any], name: str) -> Any:
    return sd1_family.make_scheduler(name, dict(parts["scheduler"].config))


def _diffusers_scheduler(parts: dict[str, Any], name: str) -> Any:
    """The sampler as a diffusers user switches to it: the class's from_config on the pipeline's scheduler config."""
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler

    config = parts["scheduler"].config
    if name == "dpmpp_2m":
        return DPMSolverMultistepScheduler.from_config(config, algorithm_type="dpmsolver++", solver_order=2)
    return {"euler": EulerDiscreteScheduler, "ddim": DDIMScheduler}[name].from_config(config)


def _pipeline(parts: dict[str, Any], name: str, img2img: bool = False) -> Any:
    from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionPipeline

    cls = StableDiffusionImg2ImgPipeline if img2img else StableDiffusionPipeline
    pipe = cls(
        vae=parts["vae"],
        text_encoder=parts["text_encoder"],
        tokenizer=parts["tokenizer"],
        unet=parts["unet"],
        scheduler=_diffusers_scheduler(parts, name),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image).astype(np.int16)


def _conditioning(parts: dict[str, Any], prompt: str = PROMPT) -> dict[str, torch.Tensor]:
    encode = sd1.encode_prompt
    return {
        "positive": encode(parts["text_encoder"], parts["tokenizer"], prompt, "cpu"),
        "negative": encode(parts["text_encoder"], parts["tokenizer"], "", "cpu"),
    }


def _generate(parts: dict[str, Any], scheduler: str, **kwargs: Any) -> torch.Tensor:
    return sd1.denoise(
        parts["unet"],
        _scheduler(parts, scheduler),
        **_conditioning(parts),
        width=SIZE,
        height=SIZE,
        steps=STEPS,
        cfg_scale=CFG,
        seed=SEED,
        device="cpu",
        dtype=torch.float32,
        **kwargs,
    )


@pytest.mark.parametrize("scheduler", PARITY_SCHEDULERS)
def test_text_to_image_equals_the_stock_pipeline(parity_parts: dict[str, Any], scheduler: str) -> None:
    expected = _pipeline(parity_parts, scheduler)(
        PROMPT,
        num_inference_steps=STEPS,
        guidance_scale=CFG,
        generator=torch.Generator().manual_seed(SEED),
        height=SIZE,
        width=SIZE,
    ).images[0]
    steps: list[tuple[int, int]] = []
    latents = _generate(parity_parts, scheduler, on_step=lambda step, total, _: steps.append((step, total)))
    image = sd1.vae_decode(parity_parts["vae"], latents)
    assert image.size == (SIZE, SIZE) and image.mode == "RGB"
    assert np.abs(_pixels(image) - _pixels(expected)).max() <= 1
    assert steps == [(step, STEPS) for step in range(1, STEPS + 1)]


def test_prompt_embeddings_equal_the_pipelines(sd1_parts: dict[str, Any]) -> None:
    pipe = _pipeline(sd1_parts, "euler")
    with torch.no_grad():
        positive, negative = pipe.encode_prompt(PROMPT, "cpu", 1, True, negative_prompt=None)
    ours = _conditioning(sd1_parts)
    assert torch.equal(ours["positive"], positive) and torch.equal(ours["negative"], negative)


def _init_image(parts: dict[str, Any]) -> Image.Image:
    latents = torch.randn(1, 4, SIZE // 8, SIZE // 8, generator=torch.Generator().manual_seed(3))
    return sd1.vae_decode(parts["vae"], latents * parts["vae"].config.scaling_factor)


@pytest.mark.parametrize("scheduler", PARITY_SCHEDULERS)
def test_image_to_image_equals_the_stock_pipeline(parity_parts: dict[str, Any], scheduler: str) -> None:
    init = _init_image(parity_parts)
    expected = _pipeline(parity_parts, scheduler, img2img=True)(
        PROMPT,
        image=init,
        strength=0.6,
        num_inference_steps=STEPS,
        guidance_scale=CFG,
        generator=torch.Generator().manual_seed(SEED),
    ).images[0]
    steps: list[tuple[int, int]] = []
    latents = _generate(
        parity_parts,
        scheduler,
        init_latents=sd1.vae_encode(parity_parts["vae"], init, SEED),
        strength=0.6,
        on_step=lambda step, total, _: steps.append((step, total)),
    )
    image = sd1.vae_decode(parity_parts["vae"], latents)
    assert np.abs(_pixels(image) - _pixels(expected)).max() <= 1
    # strength 0.6 of 4 steps keeps int(2.4) = 2, as the pipeline does.
    assert steps == [(1, 2), (2, 2)]
    # And it is not simply text-to-image: the init image shows through.
    text_only = sd1.vae_decode(parity_parts["vae"], _generate(parity_parts, scheduler))
    assert np.abs(_pixels(image) - _pixels(text_only)).max() > 10


def test_the_callers_scheduler_is_left_untouched(sd1_parts: dict[str, Any]) -> None:
    scheduler = _scheduler(sd1_parts, "dpmpp_2m")
    kwargs = dict(width=SIZE, height=SIZE, steps=2, cfg_scale=CFG, seed=SEED, device="cpu", dtype=torch.float32)
    first = sd1.denoise(sd1_parts["unet"], scheduler, **_conditioning(sd1_parts), **kwargs)
    second = sd1.denoise(sd1_parts["unet"], scheduler, **_conditioning(sd1_parts), **kwargs)
    assert scheduler.num_inference_steps is None
    assert torch.equal(first, second)


def test_a_scheduler_that_has_run_gives_the_same_generation_as_a_new_one(sd1_parts: dict[str, Any]) -> None:
    # The run's copy is taken of the caller's scheduler as it is: what state a used one carries must not leak in.
    used = _scheduler(sd1_parts, "dpmpp_2m")
    used.set_timesteps(7)
    sample = torch.randn(1, 4, SIZE // 8, SIZE // 8, generator=torch.Generator().manual_seed(1))
    for timestep in used.timesteps[:3]:
        sample = used.step(torch.randn_like(sample), timestep, sample).prev_sample
    kwargs = dict(width=SIZE, height=SIZE, steps=2, cfg_scale=CFG, seed=SEED, device="cpu", dtype=torch.float32)
    after_use = sd1.denoise(sd1_parts["unet"], used, **_conditioning(sd1_parts), **kwargs)
    new = sd1.denoise(sd1_parts["unet"], _scheduler(sd1_parts, "dpmpp_2m"), **_conditioning(sd1_parts), **kwargs)
    assert torch.equal(after_use, new)


def test_a_raising_callback_stops_the_generation(sd1_parts: dict[str, Any]) -> None:
    class Cancelled(Exception):
        pass

    seen: list[int] = []

    def cancel_at_two(step: int, total: int, latents: torch.Tensor) -> None:
        seen.append(step)
        if step == 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        _generate(sd1_parts, "euler", on_step=cancel_at_two)
    assert seen == [1, 2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"width": 60}, "multiples of 8"),
        ({"strength": 1.5}, "strength"),
        ({"init_latents": torch.zeros(1, 4, 4, 4)}, "init_latents have shape"),
    ],
)
def test_bad_arguments_are_refused(sd1_parts: dict[str, Any], kwargs: dict[str, Any], match: str) -> None:
    base: dict[str, Any] = dict(
        width=SIZE, height=SIZE, steps=STEPS, cfg_scale=CFG, seed=SEED, device="cpu", dtype=torch.float32
    )
    with pytest.raises(ValueError, match=match):
        sd1.denoise(sd1_parts["unet"], _scheduler(sd1_parts, "euler"), **_conditioning(sd1_parts), **{**base, **kwargs})


def test_latents_preview_is_small_and_cheap() -> None:
    small = rgb_preview(torch.randn(1, 4, 8, 8), sd1.LATENT_RGB)
    assert small.size == (8, 8) and small.mode == "RGB"
    large = rgb_preview(torch.randn(1, 4, 128, 96), sd1.LATENT_RGB)
    assert max(large.size) <= PREVIEW_MAX_SIZE and large.size == (48, 64)  # PIL sizes are (width, height)
    # Latents that decode to a strongly coloured image give that colour: channel 0 drives red up, channel 3 blue down.
    red = torch.zeros(1, 4, 8, 8)
    red[:, 0] = 1.0
    r, g, b = np.asarray(rgb_preview(red, sd1.LATENT_RGB)).reshape(-1, 3).mean(axis=0)
    assert r > g > b
