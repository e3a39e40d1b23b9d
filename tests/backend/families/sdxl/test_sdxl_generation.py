"""SDXL generation against diffusers' own pipelines: the same components, prompt, seed, scheduler, steps and size
give the same image (within 1/255 per pixel), text-to-image and image-to-image."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from invokeai.backend.families.sd_schedulers import SD_SCHEDULER_NAMES, scheduler_choice
from invokeai.backend.families.sdxl import generation
from invokeai.backend.families.sdxl.descriptor import FAMILY

PROMPT = "a photo of a cat"
STEPS = 3


def _scheduler(parts: dict[str, Any], name: str) -> Any:
    return FAMILY.make_scheduler(name, dict(parts["scheduler"].config))


def _stock_scheduler(parts: dict[str, Any], name: str) -> Any:
    """The sampler as a diffusers user switches the pipeline to it: the class's from_config with the options."""
    import diffusers

    choice = scheduler_choice(name)
    return getattr(diffusers, choice.class_name).from_config(dict(parts["scheduler"].config), **choice.options)


def _pipeline(parts: dict[str, Any], name: str, img2img: bool = False) -> Any:
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline

    cls = StableDiffusionXLImg2ImgPipeline if img2img else StableDiffusionXLPipeline
    pipe = cls(**{**parts, "scheduler": _stock_scheduler(parts, name)}, add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def _max_diff(a: Image.Image, b: Image.Image) -> int:
    assert a.size == b.size
    return int(np.abs(_pixels(a) - _pixels(b)).max())


def _conditioning(parts: dict[str, Any], prompt: str, prompt_2: str | None = None) -> generation.SdxlConditioning:
    return generation.encode_prompt(
        parts["text_encoder"],
        parts["text_encoder_2"],
        parts["tokenizer"],
        parts["tokenizer_2"],
        prompt,
        "cpu",
        prompt_2=prompt_2,
    )


def _ours(
    parts: dict[str, Any],
    name: str,
    *,
    width: int,
    height: int,
    seed: int,
    negative: str | None,
    cfg: float = 5.0,
    prompt_2: str | None = None,
    steps: int = STEPS,
    **kwargs: Any,
) -> Image.Image:
    latents = generation.denoise(
        parts["unet"],
        _scheduler(parts, name),
        positive=_conditioning(parts, PROMPT, prompt_2),
        negative=None if negative is None else _conditioning(parts, negative),
        width=width,
        height=height,
        steps=steps,
        cfg_scale=cfg,
        seed=seed,
        device="cpu",
        dtype=torch.float32,
        projection_dim=parts["text_encoder_2"].config.projection_dim,
        **kwargs,
    )
    return generation.vae_decode(parts["vae"], latents)


@pytest.mark.parametrize(
    ("name", "width", "height", "seed", "negative", "cfg"),
    [
        ("euler", 64, 64, 0, None, 5.0),
        ("euler_a", 96, 64, 7, "blurry", 5.0),
        ("dpmpp_2m_k", 64, 128, 3, "", 7.5),
        ("euler", 64, 64, 11, None, 1.0),
    ],
)
def test_text_to_image_equals_the_pipeline(
    sdxl_parts: dict[str, Any], name: str, width: int, height: int, seed: int, negative: str | None, cfg: float
) -> None:
    ours = _ours(sdxl_parts, name, width=width, height=height, seed=seed, negative=negative, cfg=cfg)
    stock = _pipeline(sdxl_parts, name)(
        PROMPT,
        negative_prompt=negative,
        width=width,
        height=height,
        num_inference_steps=STEPS,
        guidance_scale=cfg,
        generator=torch.Generator("cpu").manual_seed(seed),
    ).images[0]
    assert ours.size == (width, height)
    assert _max_diff(ours, stock) <= 1


@pytest.mark.parametrize("name", SD_SCHEDULER_NAMES)
def test_every_scheduler_name_samples_as_the_pipeline_does(sdxl_parts: dict[str, Any], name: str) -> None:
    ours = _ours(sdxl_parts, name, width=64, height=64, seed=5, negative=None, steps=2)
    stock = _pipeline(sdxl_parts, name)(
        PROMPT,
        width=64,
        height=64,
        num_inference_steps=2,
        guidance_scale=5.0,
        generator=torch.Generator("cpu").manual_seed(5),
    ).images[0]
    assert _max_diff(ours, stock) <= 1


def test_prompt_2_reaches_the_second_encoder(sdxl_parts: dict[str, Any]) -> None:
    ours = _ours(sdxl_parts, "euler", width=64, height=64, seed=1, negative=None, prompt_2="a red house")
    stock = _pipeline(sdxl_parts, "euler")(
        PROMPT,
        prompt_2="a red house",
        width=64,
        height=64,
        num_inference_steps=STEPS,
        guidance_scale=5.0,
        generator=torch.Generator("cpu").manual_seed(1),
    ).images[0]
    same_prompt = _ours(sdxl_parts, "euler", width=64, height=64, seed=1, negative=None)
    assert _max_diff(ours, stock) <= 1
    assert _max_diff(ours, same_prompt) > 1


def _init_image(size: tuple[int, int]) -> Image.Image:
    rng = np.random.default_rng(5)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


@pytest.mark.parametrize(
    ("name", "size", "seed", "strength"),
    [("euler", (64, 64), 2, 0.6), ("dpmpp_2m_k", (96, 64), 9, 0.75)],
)
def test_image_to_image_equals_the_pipeline(
    sdxl_parts: dict[str, Any], name: str, size: tuple[int, int], seed: int, strength: float
) -> None:
    image = _init_image(size)
    init = generation.vae_encode(sdxl_parts["vae"], image, seed)
    ours = _ours(
        sdxl_parts, name, width=size[0], height=size[1], seed=seed, negative=None, init_latents=init, strength=strength
    )
    stock = _pipeline(sdxl_parts, name, img2img=True)(
        PROMPT,
        image=image,
        strength=strength,
        num_inference_steps=STEPS,
        guidance_scale=5.0,
        generator=torch.Generator("cpu").manual_seed(seed),
    ).images[0]
    assert _max_diff(ours, stock) <= 1


def test_every_step_is_reported_and_a_raising_callback_cancels(sdxl_parts: dict[str, Any]) -> None:
    seen: list[tuple[int, int]] = []

    def on_step(step: int, total: int, latents: torch.Tensor) -> None:
        seen.append((step, total))
        if step == 2:
            raise InterruptedError("cancelled")

    with pytest.raises(InterruptedError):
        _ours(sdxl_parts, "euler", width=64, height=64, seed=0, negative=None, on_step=on_step)
    assert seen == [(1, STEPS), (2, STEPS)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"width": 60}, "multiples of 8"),
        ({"strength": 1.5}, "strength"),
        ({"steps": 0}, "steps"),
    ],
)
def test_bad_input_is_refused_by_name(sdxl_parts: dict[str, Any], kwargs: dict[str, Any], message: str) -> None:
    conditioning = _conditioning(sdxl_parts, PROMPT)
    args = dict(
        positive=conditioning,
        negative=None,
        width=64,
        height=64,
        steps=STEPS,
        cfg_scale=5.0,
        seed=0,
        device="cpu",
        dtype=torch.float32,
    )
    with pytest.raises(ValueError, match=message):
        generation.denoise(sdxl_parts["unet"], _scheduler(sdxl_parts, "euler"), **{**args, **kwargs})


def test_fp16_vae_decodes_upcast_and_is_restored(sdxl_parts: dict[str, Any]) -> None:
    """force_upcast: an fp16 VAE decodes in fp32 (as the pipeline does) and is left in fp16 after."""
    import copy

    vae16 = copy.deepcopy(sdxl_parts["vae"]).to(torch.float16)
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    assert generation.decode_upcasts(vae16)
    upcast = generation.vae_decode(vae16, latents.half())
    assert vae16.dtype == torch.float16
    reference = generation.vae_decode(copy.deepcopy(vae16).float(), latents.half().float())
    assert _max_diff(upcast, reference) == 0


@pytest.mark.parametrize("img2img", [False, True], ids=["text-to-image", "image-to-image"])
def test_a_vae_with_latent_mean_and_std_is_used_as_the_pipelines_use_it(
    sdxl_parts: dict[str, Any], img2img: bool
) -> None:
    import copy

    vae = copy.deepcopy(sdxl_parts["vae"])
    vae.register_to_config(latents_mean=[1.0, -2.0, 1.5, 0.5], latents_std=[1.1, 0.9, 1.2, 1.5])
    parts = {**sdxl_parts, "vae": vae}
    generator = torch.Generator("cpu").manual_seed(4)
    if img2img:
        image = _init_image((64, 64))
        init = generation.vae_encode(vae, image, 4)
        ours = _ours(parts, "euler", width=64, height=64, seed=4, negative=None, init_latents=init, strength=0.7)
        stock = _pipeline(parts, "euler", img2img=True)(
            PROMPT, image=image, strength=0.7, num_inference_steps=STEPS, guidance_scale=5.0, generator=generator
        ).images[0]
    else:
        ours = _ours(parts, "euler", width=64, height=64, seed=4, negative=None)
        stock = _pipeline(parts, "euler")(
            PROMPT, width=64, height=64, num_inference_steps=STEPS, guidance_scale=5.0, generator=generator
        ).images[0]
    plain = _ours(sdxl_parts, "euler", width=64, height=64, seed=4, negative=None)
    assert _max_diff(ours, stock) <= 1
    assert img2img or _max_diff(ours, plain) > 1
