"""FLUX.1 generation equals the stock pipelines' images: FluxPipeline (dev: guidance embedding, 512 T5 tokens;
schnell: none, 256 tokens, its fixed-shift scheduler) and FluxImg2ImgPipeline, on demo-flux, CPU fp32, for several
sizes and seeds, within 1/255 per pixel."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from invokeai.backend.families.flux import demo, generation
from invokeai.backend.families.flux.constants import default_t5_tokens

STEPS = 3


def ours(pipe: Any, prompt: str, width: int, height: int, seed: int, **kwargs: Any) -> tuple[Image.Image, list]:
    msl = kwargs.pop("max_sequence_length", default_t5_tokens(pipe.transformer.config))
    steps: list = []
    pooled = generation.encode_clip(pipe.text_encoder, pipe.tokenizer, prompt, "cpu")
    t5 = generation.encode_t5(pipe.text_encoder_2, pipe.tokenizer_2, prompt, "cpu", msl)
    latents = generation.denoise(
        pipe.transformer,
        pipe.scheduler,
        prompt_embeds=t5,
        pooled_embeds=pooled,
        width=width,
        height=height,
        steps=STEPS,
        seed=seed,
        device="cpu",
        dtype=torch.float32,
        on_step=lambda step, total, lat: steps.append((step, total, tuple(lat.shape))),
        **kwargs,
    )
    return generation.vae_decode(pipe.vae, latents), steps


def max_diff(a: Image.Image, b: Image.Image) -> int:
    assert a.size == b.size
    return int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())


@pytest.mark.parametrize(("width", "height", "seed"), [(64, 64, 0), (96, 64, 7), (64, 80, 123)])
def test_dev_text_to_image_equals_flux_pipeline(flux_pipe: Any, width: int, height: int, seed: int) -> None:
    prompt = "a photo of a red house"
    mine, steps = ours(flux_pipe, prompt, width, height, seed, guidance=4.0)
    theirs = flux_pipe(
        prompt,
        width=width,
        height=height,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        generator=torch.Generator("cpu").manual_seed(seed),
    ).images[0]
    assert max_diff(mine, theirs) <= 1
    assert steps == [(i, STEPS, (1, 16, height // 8, width // 8)) for i in range(1, STEPS + 1)]


def test_guidance_changes_the_dev_image(flux_pipe: Any) -> None:
    low, _ = ours(flux_pipe, "a cat", 64, 64, 0, guidance=1.0)
    high, _ = ours(flux_pipe, "a cat", 64, 64, 0, guidance=8.0)
    assert max_diff(low, high) > 1


@pytest.fixture(scope="module")
def schnell_pipe(flux_pipe: Any) -> Any:
    """demo-flux's components with a schnell-like transformer (no guidance embedding) and schnell's scheduler."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    scheduler = FlowMatchEulerDiscreteScheduler(**{**demo.SCHEDULER, "shift": 1.0, "use_dynamic_shifting": False})
    components = {**flux_pipe.components, "scheduler": scheduler}
    components["transformer"] = demo.build_transformer(guidance_embeds=False)
    pipe = FluxPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize(("width", "height", "seed"), [(64, 64, 3), (80, 48, 11)])
def test_schnell_text_to_image_equals_flux_pipeline(schnell_pipe: Any, width: int, height: int, seed: int) -> None:
    assert default_t5_tokens(schnell_pipe.transformer.config) == 256
    mine, _ = ours(schnell_pipe, "a blue sky", width, height, seed)
    theirs = schnell_pipe(
        "a blue sky",
        width=width,
        height=height,
        num_inference_steps=STEPS,
        max_sequence_length=256,
        generator=torch.Generator("cpu").manual_seed(seed),
    ).images[0]
    assert max_diff(mine, theirs) <= 1


@pytest.mark.parametrize(("strength", "seed"), [(0.6, 5), (0.9, 8)])
def test_image_to_image_equals_flux_img2img_pipeline(flux_pipe: Any, strength: float, seed: int) -> None:
    from diffusers import FluxImg2ImgPipeline

    pixels = (np.random.RandomState(seed).rand(64, 96, 3) * 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    init = generation.vae_encode(flux_pipe.vae, image, seed)
    mine, steps = ours(flux_pipe, "a green tree", 96, 64, seed, init_latents=init, strength=strength)
    img2img = FluxImg2ImgPipeline(**flux_pipe.components)
    img2img.set_progress_bar_config(disable=True)
    theirs = img2img(
        "a green tree",
        image=image,
        width=96,
        height=64,
        strength=strength,
        guidance_scale=3.5,
        num_inference_steps=STEPS,
        generator=torch.Generator("cpu").manual_seed(seed),
    ).images[0]
    assert max_diff(mine, theirs) <= 1
    # FluxImg2ImgPipeline keeps steps - int(steps - steps x strength): 2 of 3 at 0.6 (SD's rule would keep 1).
    assert len(steps) == STEPS - int(STEPS - STEPS * strength)


def test_sizes_off_the_packed_multiple_are_refused(flux_pipe: Any) -> None:
    with pytest.raises(ValueError, match="multiples of 16"):
        ours(flux_pipe, "a cat", 72, 64, 0)


def test_strength_leaving_no_step_is_refused(flux_pipe: Any) -> None:
    init = torch.zeros(1, 16, 8, 8)
    with pytest.raises(ValueError, match="leaves no step"):
        ours(flux_pipe, "a cat", 64, 64, 0, init_latents=init, strength=0.0)


def test_preview_projection_is_fitted_on_the_denoisers_latents(flux_pipe: Any) -> None:
    """Applied to the shifted and scaled latents the VAE makes for solid colours it was not fitted on (what the
    transformer holds), the map gives the colours back better than the best constant does, and better than on the
    VAE's raw latents. The demo VAE has random weights, so only somewhat better."""
    from invokeai.backend.generation.preview import FIT_SIZE

    vae = flux_pipe.vae
    projection = generation.preview_projection(vae)
    assert projection.channels == 16
    assert generation.known_preview_projection(vae) is projection
    assert generation.preview_projection(vae) is projection  # fitted once per VAE module
    colours = torch.rand(32, 3, generator=torch.Generator().manual_seed(5)) * 2 - 1
    with torch.inference_mode():
        raw = vae.encode(colours.view(-1, 3, 1, 1).expand(-1, -1, FIT_SIZE, FIT_SIZE)).latent_dist.mode()

    def error(latents: torch.Tensor) -> float:
        cells = latents.permute(0, 2, 3, 1).reshape(len(colours), -1, 16)
        return float((cells @ projection.weights + projection.bias - colours[:, None]).abs().mean())

    normalised = error((raw - vae.config.shift_factor) * vae.config.scaling_factor)
    constant = float((colours - colours.mean(dim=0)).abs().mean())
    assert normalised < constant
    assert normalised < error(raw)


def test_an_image_off_the_packed_multiple_is_refused_by_vae_encode(flux_pipe: Any) -> None:
    with pytest.raises(ValueError, match="got 72x64"):
        generation.vae_encode(flux_pipe.vae, Image.new("RGB", (72, 64)), 0)


# InvokeAI's flux_denoise (generation.denoise_invokeai): its noise, schedule and samplers.


def test_invokeais_noise_is_the_seeds_cpu_draw_in_half_precision() -> None:
    noise = generation.invokeai_noise(96, 64, 42, "cpu", torch.float32)
    draw = torch.randn(1, 16, 8, 12, generator=torch.Generator("cpu").manual_seed(42), dtype=torch.float32)
    assert noise.shape == (1, 16, 8, 12) and noise.dtype == torch.float32
    assert torch.equal(noise, draw.half().float())  # the same stream, rounded to float16
    assert not torch.equal(noise, draw)


def invokeai_ours(pipe: Any, prompt: str, width: int, height: int, seed: int, **kwargs: Any) -> Image.Image:
    pooled = generation.encode_clip(pipe.text_encoder, pipe.tokenizer, prompt, "cpu")
    t5 = generation.encode_t5(pipe.text_encoder_2, pipe.tokenizer_2, prompt, "cpu", 256)
    latents = generation.denoise_invokeai(
        pipe.transformer,
        positive=generation.Prompt(t5, pooled),
        negative=kwargs.pop("negative", None),
        width=width,
        height=height,
        steps=STEPS,
        seed=seed,
        device="cpu",
        dtype=torch.float32,
        **kwargs,
    )
    return generation.vae_decode(pipe.vae, latents)


@pytest.mark.parametrize("variant", ["dev", "schnell"])
def test_invokeais_text_to_image_is_flux_pipelines_from_its_noise(
    flux_pipe: Any, schnell_pipe: Any, variant: str
) -> None:
    """dev: the shifted schedule and the guidance embedding; schnell: the schedule unshifted, as InvokeAI runs it."""
    pipe = flux_pipe if variant == "dev" else schnell_pipe
    mine = invokeai_ours(pipe, "a red house", 96, 64, 9, guidance=4.0)
    noise = generation.invokeai_noise(96, 64, 9, "cpu", torch.float32)
    theirs = pipe(
        "a red house",
        width=96,
        height=64,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        max_sequence_length=256,
        latents=generation.pack_latents(noise),
    ).images[0]
    assert max_diff(mine, theirs) <= 1


def test_invokeais_schedule_is_cut_fractionally() -> None:
    schedule = generation.invokeai_schedule(4, 64, 64, shifted=False)
    assert schedule == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    # The last time at or above 1 - start becomes 1 - start; 1 - end is added below the last one above it.
    assert generation.clip_schedule(schedule, 0.3, 1.0) == pytest.approx([0.7, 0.5, 0.25, 0.0])
    assert generation.clip_schedule(schedule, 0.0, 0.6) == pytest.approx([1.0, 0.75, 0.5, 0.4])
    assert generation.clip_schedule(schedule, 0.25, 0.5) == pytest.approx([0.75, 0.5])
    shifted = generation.invokeai_schedule(4, 1024, 1024, shifted=True)
    assert shifted[0] == 1.0 and shifted[-1] == 0.0 and shifted[2] > 0.5  # pushed toward 1
    with pytest.raises(ValueError, match="denoising_start"):
        generation.clip_schedule(schedule, 0.8, 0.2)


def test_cfg_schedule_is_invokeais() -> None:
    assert generation.cfg_schedule(3.0, 4, 1, -2) == [1.0, 3.0, 3.0, 1.0]
    assert generation.cfg_schedule([2.0, 3.0, 4.0], 3, 0, -1) == [2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="cfg_scale has 2 values"):
        generation.cfg_schedule([2.0, 3.0], 3, 0, -1)
    with pytest.raises(ValueError, match="cfg_scale_start_step"):
        generation.cfg_schedule(2.0, 3, 3, -1)


def test_a_start_equal_to_the_end_only_noises(flux_pipe: Any) -> None:
    init = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(1))
    pooled = generation.encode_clip(flux_pipe.text_encoder, flux_pipe.tokenizer, "x", "cpu")
    t5 = generation.encode_t5(flux_pipe.text_encoder_2, flux_pipe.tokenizer_2, "x", "cpu", 256)
    out = generation.denoise_invokeai(
        flux_pipe.transformer,
        positive=generation.Prompt(t5, pooled),
        negative=None,
        width=64,
        height=64,
        steps=4,
        seed=3,
        device="cpu",
        dtype=torch.float32,
        init_latents=init,
        denoising_start=0.5,
        denoising_end=0.5,
    )
    noise = generation.invokeai_noise(64, 64, 3, "cpu", torch.float32)
    assert torch.allclose(out, 0.5 * noise + 0.5 * init)


def test_heun_and_lcm_run_and_lcm_is_seeded(flux_pipe: Any) -> None:
    euler = invokeai_ours(flux_pipe, "a cat", 64, 64, 0)
    heun = invokeai_ours(flux_pipe, "a cat", 64, 64, 0, scheduler="heun")
    lcm = invokeai_ours(flux_pipe, "a cat", 64, 64, 0, scheduler="lcm")
    assert max_diff(euler, heun) > 1 and max_diff(euler, lcm) > 1
    assert max_diff(lcm, invokeai_ours(flux_pipe, "a cat", 64, 64, 0, scheduler="lcm")) == 0


def test_true_cfg_uses_the_negative_prompt_and_needs_one(flux_pipe: Any) -> None:
    pooled = generation.encode_clip(flux_pipe.text_encoder, flux_pipe.tokenizer, "blurry", "cpu")
    t5 = generation.encode_t5(flux_pipe.text_encoder_2, flux_pipe.tokenizer_2, "blurry", "cpu", 256)
    plain = invokeai_ours(flux_pipe, "a cat", 64, 64, 0)
    guided = invokeai_ours(flux_pipe, "a cat", 64, 64, 0, cfg_scale=4.0, negative=generation.Prompt(t5, pooled))
    assert max_diff(plain, guided) > 1
    with pytest.raises(ValueError, match="negative prompt"):
        invokeai_ours(flux_pipe, "a cat", 64, 64, 0, cfg_scale=4.0)
