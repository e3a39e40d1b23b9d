"""Z-Image generation equals the stock pipelines' images: ZImagePipeline (no guidance and CFG batches, prompts of
several lengths, one over the 512-token limit, a negative prompt of another length so attention is masked, a
dynamically shifted scheduler, LCM, CFG truncation and normalisation) and ZImageImg2ImgPipeline, on demo-zimage, CPU
fp32, for several sizes and seeds, within 1/255 per pixel."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from invokeai.backend.families.zimage import generation
from invokeai.backend.families.zimage.constants import TEXT_TOKENS
from invokeai.backend.families.zimage.descriptor import make_scheduler
from invokeai.backend.families.zimage.tokenizer import template_tokens

STEPS = 3
LONG_PROMPT = "a painting of a green tree in the sky and a red house " * 50  # well over 512 tokens


def ours(
    pipe: Any,
    prompt: str,
    width: int,
    height: int,
    seed: int,
    *,
    negative: str = "",
    scheduler: Any = None,
    **kwargs: Any,
) -> tuple[Image.Image, list]:
    steps: list = []
    cfg = kwargs.get("guidance_scale", 1.0)
    positive = generation.encode_prompt(pipe.text_encoder, pipe.tokenizer, prompt, "cpu")
    negative_embeds = generation.encode_prompt(pipe.text_encoder, pipe.tokenizer, negative, "cpu") if cfg > 1 else None
    latents = generation.denoise(
        pipe.transformer,
        scheduler if scheduler is not None else pipe.scheduler,
        prompt_embeds=positive,
        negative_embeds=negative_embeds,
        width=width,
        height=height,
        steps=kwargs.pop("steps", STEPS),
        seed=seed,
        device="cpu",
        dtype=torch.float32,
        on_step=lambda step, total, lat: steps.append((step, total, tuple(lat.shape))),
        **kwargs,
    )
    return generation.vae_decode(pipe.vae, latents), steps


def theirs(pipe: Any, prompt: str, width: int, height: int, seed: int, cfg: float, **kwargs: Any) -> Image.Image:
    """The stock pipeline, its guidance_scale being ours minus one."""
    return pipe(
        prompt,
        width=width,
        height=height,
        num_inference_steps=kwargs.pop("steps", STEPS),
        guidance_scale=cfg - 1.0,
        generator=torch.Generator("cpu").manual_seed(seed),
        **kwargs,
    ).images[0]


def max_diff(a: Image.Image, b: Image.Image) -> int:
    assert a.size == b.size
    return int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())


@contextmanager
def recorded_masks() -> Iterator[list[bool]]:
    """Whether each SDPA call got a mask (diffusers and transformers look SDPA up at call time)."""
    masks: list[bool] = []
    real = F.scaled_dot_product_attention

    def recorder(query, key, value, attn_mask=None, *args, **kwargs):  # type: ignore[no-untyped-def]
        masks.append(attn_mask is not None)
        return real(query, key, value, attn_mask, *args, **kwargs)

    F.scaled_dot_product_attention = recorder
    try:
        yield masks
    finally:
        F.scaled_dot_product_attention = real


@pytest.mark.parametrize(
    ("width", "height", "seed", "cfg", "prompt"),
    [
        (64, 64, 0, 1.0, "a photo of a red house"),  # Turbo's way: no guidance (diffusers' 0)
        (96, 64, 7, 3.0, "a cat"),
        (64, 80, 123, 2.5, "a photo of a blue sky over a green tree, a painting of a dog in a red house"),
        (48, 64, 5, 2.0, LONG_PROMPT),
        (80, 48, 11, 1.0, "a dog"),
    ],
)
def test_text_to_image_equals_zimage_pipeline(
    zimage_pipe: Any, width: int, height: int, seed: int, cfg: float, prompt: str
) -> None:
    mine, steps = ours(zimage_pipe, prompt, width, height, seed, guidance_scale=cfg)
    assert max_diff(mine, theirs(zimage_pipe, prompt, width, height, seed, cfg)) <= 1
    assert steps == [(i, STEPS, (1, 16, height // 8, width // 8)) for i in range(1, STEPS + 1)]


def test_a_prompt_over_the_limit_is_cut_to_512_tokens(zimage_pipe: Any) -> None:
    assert template_tokens(zimage_pipe.tokenizer, LONG_PROMPT) > TEXT_TOKENS
    embeds = generation.encode_prompt(zimage_pipe.text_encoder, zimage_pipe.tokenizer, LONG_PROMPT, "cpu")
    assert embeds.shape == (TEXT_TOKENS, zimage_pipe.transformer.config.cap_feat_dim)
    short = generation.encode_prompt(zimage_pipe.text_encoder, zimage_pipe.tokenizer, "a cat", "cpu")
    assert short.shape[0] == template_tokens(zimage_pipe.tokenizer, "a cat")


def test_a_cfg_batch_of_unequal_captions_is_masked_and_equals_the_pipeline(zimage_pipe: Any) -> None:
    """A 40-odd-token prompt against a 2-token negative pads to 64 and 32 caption tokens: the context refiners and
    main layers get a key mask, in the pipeline and here alike."""
    prompt, negative = "a photo of a red house under a blue sky (no. 12345, oil on canvas)", "a dog"
    assert template_tokens(zimage_pipe.tokenizer, prompt) > 32 >= template_tokens(zimage_pipe.tokenizer, negative)
    with recorded_masks() as masks:
        mine, _ = ours(zimage_pipe, prompt, 64, 64, 3, negative=negative, guidance_scale=4.0)
    assert any(masks) and not all(masks)
    stock = theirs(zimage_pipe, prompt, 64, 64, 3, 4.0, negative_prompt=negative)
    assert max_diff(mine, stock) <= 1


def test_the_prompt_and_guidance_change_the_image(zimage_pipe: Any) -> None:
    cat, _ = ours(zimage_pipe, "a cat", 64, 64, 0)
    dog, _ = ours(zimage_pipe, "a dog", 64, 64, 0)
    guided, _ = ours(zimage_pipe, "a cat", 64, 64, 0, guidance_scale=5.0)
    assert max_diff(cat, dog) > 1 and max_diff(cat, guided) > 1


def test_a_dynamically_shifted_scheduler_equals_the_pipeline(zimage_pipe: Any) -> None:
    """The shift mu the pipeline computes from the image size matters once the config asks for it."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    config = {**zimage_pipe.scheduler.config, "use_dynamic_shifting": True}
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(config)
    pipe = ZImagePipeline(**{**zimage_pipe.components, "scheduler": scheduler})
    pipe.set_progress_bar_config(disable=True)
    mine, _ = ours(pipe, "a red house", 96, 80, 9, guidance_scale=2.0)
    assert max_diff(mine, theirs(pipe, "a red house", 96, 80, 9, 2.0)) <= 1
    static, _ = ours(zimage_pipe, "a red house", 96, 80, 9, guidance_scale=2.0)
    assert max_diff(mine, static) > 1


def test_cfg_truncation_and_normalisation_equal_the_pipeline(zimage_pipe: Any) -> None:
    options = dict(cfg_truncation=0.5, cfg_normalization=1.05)
    mine, _ = ours(zimage_pipe, "a blue sky", 64, 64, 2, guidance_scale=6.0, steps=4, **options)
    assert max_diff(mine, theirs(zimage_pipe, "a blue sky", 64, 64, 2, 6.0, steps=4, **options)) <= 1
    plain, _ = ours(zimage_pipe, "a blue sky", 64, 64, 2, guidance_scale=6.0, steps=4)
    assert max_diff(mine, plain) > 1


def test_lcm_equals_the_pipeline_with_the_same_step_noise(zimage_pipe: Any) -> None:
    """LCM re-noises after every step; the pipeline passes its step no generator, so the stock run is given the
    pipeline's own generator there, the stream the denoiser here continues from its seed."""
    from diffusers import ZImagePipeline

    scheduler = make_scheduler("lcm", zimage_pipe.scheduler.config)
    pipe = ZImagePipeline(**{**zimage_pipe.components, "scheduler": scheduler})
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator("cpu").manual_seed(4)
    step = pipe.scheduler.step
    pipe.scheduler.step = lambda *args, **kwargs: step(*args, generator=generator, **kwargs)
    stock = pipe(
        "a cat", width=64, height=64, num_inference_steps=STEPS, guidance_scale=0.0, generator=generator
    ).images[0]
    mine, _ = ours(zimage_pipe, "a cat", 64, 64, 4, scheduler=make_scheduler("lcm", zimage_pipe.scheduler.config))
    assert max_diff(mine, stock) <= 1
    euler, _ = ours(zimage_pipe, "a cat", 64, 64, 4)
    assert max_diff(mine, euler) > 1


@pytest.mark.parametrize(("strength", "seed", "cfg"), [(0.6, 5, 1.0), (0.9, 8, 2.0)])
def test_image_to_image_equals_zimage_img2img_pipeline(
    zimage_pipe: Any, strength: float, seed: int, cfg: float
) -> None:
    from diffusers import ZImageImg2ImgPipeline

    pixels = (np.random.RandomState(seed).rand(64, 96, 3) * 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    init = generation.vae_encode(zimage_pipe.vae, image, seed)
    mine, steps = ours(
        zimage_pipe, "a green tree", 96, 64, seed, init_latents=init, strength=strength, guidance_scale=cfg, steps=4
    )
    img2img = ZImageImg2ImgPipeline(**zimage_pipe.components)
    img2img.set_progress_bar_config(disable=True)
    stock = theirs(img2img, "a green tree", 96, 64, seed, cfg, image=image, strength=strength, steps=4)
    assert max_diff(mine, stock) <= 1
    assert len(steps) == 4 - int(4 - 4 * strength)


def test_bad_arguments_are_refused(zimage_pipe: Any) -> None:
    with pytest.raises(ValueError, match="multiples of 16"):
        ours(zimage_pipe, "a cat", 72, 64, 0)
    with pytest.raises(ValueError, match="at least 1"):
        ours(zimage_pipe, "a cat", 64, 64, 0, guidance_scale=0.5)
    positive = torch.zeros(4, 32)
    with pytest.raises(ValueError, match="needs negative_embeds"):
        generation.denoise(
            zimage_pipe.transformer,
            zimage_pipe.scheduler,
            prompt_embeds=positive,
            width=64,
            height=64,
            steps=2,
            seed=0,
            device="cpu",
            dtype=torch.float32,
            guidance_scale=2.0,
        )
    with pytest.raises(ValueError, match="leaves no step"):
        ours(zimage_pipe, "a cat", 64, 64, 0, init_latents=torch.zeros(1, 16, 8, 8), strength=0.0)


def test_preview_projection_is_fitted_on_the_denoisers_latents(zimage_pipe: Any) -> None:
    """Applied to the shifted and scaled latents the VAE makes for solid colours it was not fitted on, the map
    gives the colours back better than the best constant does (the demo VAE has random weights)."""
    from invokeai.backend.generation.preview import FIT_SIZE

    vae = zimage_pipe.vae
    projection = generation.preview_projection(vae)
    assert projection.channels == 16
    assert generation.known_preview_projection(vae) is projection
    assert generation.preview_projection(vae) is projection
    colours = torch.rand(32, 3, generator=torch.Generator().manual_seed(5)) * 2 - 1
    with torch.inference_mode():
        raw = vae.encode(colours.view(-1, 3, 1, 1).expand(-1, -1, FIT_SIZE, FIT_SIZE)).latent_dist.mode()
    latents = (raw - vae.config.shift_factor) * vae.config.scaling_factor
    cells = latents.permute(0, 2, 3, 1).reshape(len(colours), -1, 16)
    error = float((cells @ projection.weights + projection.bias - colours[:, None]).abs().mean())
    assert error < float((colours - colours.mean(dim=0)).abs().mean())
