"""Qwen-Image generation equals the stock pipelines' images: QwenImagePipeline (several sizes, seeds and true CFG
scales, with and without a negative prompt, a prompt past the 512-token cut, batches of prompts of different
lengths, which pad and pass boolean masks to the text encoder and the transformer, served by the installed attention
dispatcher) and QwenImageImg2ImgPipeline, on demo-qwen-image, CPU fp32, within 1/255 per pixel."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from invokeai.backend.attention import attention_caller, attention_stats, install_attention
from invokeai.backend.attention.testing import pristine_attention
from invokeai.backend.families.qwen_image import generation
from invokeai.backend.families.qwen_image.constants import MAX_SEQUENCE_LENGTH, TEMPLATE_PREFIX_TOKENS
from invokeai.backend.families.qwen_image.tokenizer import check_template, template_tokens

STEPS = 3
LONG_PROMPT = "a painting of a green tree in the sky and a red house " * 50  # over 512 tokens after the template


def ours(
    pipe: Any,
    prompt: str | list[str],
    width: int,
    height: int,
    seed: int,
    cfg: float | list[float],
    negative: str | list[str] | None,
    **kwargs: Any,
) -> tuple[list[Image.Image], list]:
    steps: list = []
    embeds, mask = generation.encode_prompt(pipe.text_encoder, pipe.tokenizer, prompt, "cpu")
    negative_embeds = negative_mask = None
    if negative is not None:
        negative_embeds, negative_mask = generation.encode_prompt(pipe.text_encoder, pipe.tokenizer, negative, "cpu")
    latents = generation.denoise(
        pipe.transformer,
        pipe.scheduler,
        prompt_embeds=embeds,
        prompt_mask=mask,
        negative_embeds=negative_embeds,
        negative_mask=negative_mask,
        width=width,
        height=height,
        steps=kwargs.pop("steps", STEPS),
        seed=seed,
        device="cpu",
        dtype=torch.float32,
        true_cfg_scale=cfg,
        on_step=lambda step, total, lat: steps.append((step, total, tuple(lat.shape))),
        **kwargs,
    )
    return generation.vae_decode_all(pipe.vae, latents), steps


def theirs(
    pipe: Any, prompt: str | list[str], width: int, height: int, seed: int, cfg: float, negative: Any, **kwargs: Any
) -> list[Image.Image]:
    images: list[Image.Image] = pipe(
        prompt,
        negative_prompt=negative,
        true_cfg_scale=cfg,
        width=width,
        height=height,
        num_inference_steps=kwargs.pop("steps", STEPS),
        generator=torch.Generator("cpu").manual_seed(seed),
        **kwargs,
    ).images
    return images


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
    ("width", "height", "seed", "cfg", "prompt", "negative"),
    [
        (64, 64, 0, 4.0, "a photo of a red house", " "),  # the pipeline's defaults: true CFG 4 against " "
        (96, 64, 7, 2.5, "a cat", "blurry, low quality, watermark"),
        (64, 96, 123, 6.0, "a painting of a dog in a red house under a blue sky", "a dog"),
        (80, 48, 5, 4.0, "a dog", None),  # no negative prompt: no guidance, whatever the scale
        (48, 64, 11, 1.0, "a green tree", " "),  # a scale of 1: no guidance, whatever the negative
        (64, 48, 9, 3.0, LONG_PROMPT, " "),  # cut to 512 embeddings after the template
    ],
)
def test_text_to_image_equals_qwen_image_pipeline(
    qwen_pipe: Any, width: int, height: int, seed: int, cfg: float, prompt: str, negative: str | None
) -> None:
    (mine,), steps = ours(qwen_pipe, prompt, width, height, seed, cfg, negative)
    (stock,) = theirs(qwen_pipe, prompt, width, height, seed, cfg, negative)
    assert max_diff(mine, stock) <= 1
    assert steps == [(i, STEPS, (1, 16, height // 8, width // 8)) for i in range(1, STEPS + 1)]


def test_one_prompt_is_never_padded_nor_masked(qwen_pipe: Any) -> None:
    """One prompt per encode, as the nodes run: no padding, so the text encoder runs causal and the transformer's
    joint attention unmasked (diffusers 0.37+ passes the mask only where there is padding)."""
    with recorded_masks() as masks:
        embeds, mask = generation.encode_prompt(qwen_pipe.text_encoder, qwen_pipe.tokenizer, "a cat", "cpu")
        ours(qwen_pipe, "a cat", 64, 64, 0, 4.0, " ", steps=2)
    assert mask is None and masks and not any(masks)
    assert embeds.shape[1] == template_tokens(qwen_pipe.tokenizer, "a cat") - TEMPLATE_PREFIX_TOKENS


def test_a_prompt_over_the_limit_is_cut_to_512_embeddings(qwen_pipe: Any) -> None:
    assert template_tokens(qwen_pipe.tokenizer, LONG_PROMPT) > TEMPLATE_PREFIX_TOKENS + MAX_SEQUENCE_LENGTH
    embeds, _ = generation.encode_prompt(qwen_pipe.text_encoder, qwen_pipe.tokenizer, LONG_PROMPT, "cpu")
    assert embeds.shape == (1, MAX_SEQUENCE_LENGTH, qwen_pipe.transformer.config.joint_attention_dim)


def test_padded_prompt_batches_pass_masks_the_dispatcher_serves(qwen_pipe: Any) -> None:
    """Prompts of different lengths in one batch pad: the text encoder gets a bool mask (K/V repeated) and the
    transformer a key mask, each call through the installed dispatcher (the CPU's fused kernel takes masks), and
    every image equals the pipeline's."""
    prompts = ["a cat", "a painting of a red house under a blue sky by a green tree"]
    negatives = [" ", "blurry, low quality"]
    with pristine_attention():
        install_attention("auto", "cpu")
        with recorded_masks() as masks, attention_caller("qwen-padded"):
            mine, _ = ours(qwen_pipe, prompts, 64, 64, 7, 3.0, negatives)
        served = attention_stats().counts["qwen-padded"]
        stock = theirs(qwen_pipe, prompts, 64, 64, 7, 3.0, negatives)
    assert any(masks) and sum(served.values()) == len(masks) and "MATH" not in served
    assert all(max_diff(a, b) <= 1 for a, b in zip(mine, stock, strict=True))
    # The first image is the one prompt alone (its padding masked away), up to float rounding.
    (alone,), _ = ours(qwen_pipe, prompts[0], 64, 64, 7, 3.0, negatives[0])
    assert max_diff(alone, mine[0]) <= 1


def latents_of(pipe: Any, prompt: str, cfg: float | list[float], negative: str | None) -> torch.Tensor:
    embeds, _ = generation.encode_prompt(pipe.text_encoder, pipe.tokenizer, prompt, "cpu")
    negative_embeds = None
    if negative is not None:
        negative_embeds, _ = generation.encode_prompt(pipe.text_encoder, pipe.tokenizer, negative, "cpu")
    return generation.denoise(
        pipe.transformer,
        pipe.scheduler,
        prompt_embeds=embeds,
        negative_embeds=negative_embeds,
        width=64,
        height=64,
        steps=STEPS,
        seed=3,
        device="cpu",
        dtype=torch.float32,
        true_cfg_scale=cfg,
    )


def test_per_step_scales_guide_only_where_above_one(qwen_pipe: Any) -> None:
    scalar = latents_of(qwen_pipe, "a cat", 4.0, " ")
    assert torch.equal(latents_of(qwen_pipe, "a cat", [4.0] * STEPS, " "), scalar)
    unguided = latents_of(qwen_pipe, "a cat", 4.0, None)
    assert torch.equal(latents_of(qwen_pipe, "a cat", [1.0] * STEPS, " "), unguided)
    mixed = latents_of(qwen_pipe, "a cat", [4.0, 1.0, 4.0], " ")
    assert (mixed - scalar).abs().max() > 1e-3 and (mixed - unguided).abs().max() > 1e-3


def test_the_prompt_and_guidance_change_the_latents(qwen_pipe: Any) -> None:
    cat = latents_of(qwen_pipe, "a cat", 4.0, None)
    dog = latents_of(qwen_pipe, "a dog", 4.0, None)
    guided = latents_of(qwen_pipe, "a cat", 4.0, "a dog")
    assert (cat - dog).abs().max() > 1e-3 and (cat - guided).abs().max() > 1e-3


@pytest.mark.parametrize(("strength", "seed", "cfg", "negative"), [(0.6, 5, 4.0, " "), (0.9, 8, 2.0, None)])
def test_image_to_image_equals_qwen_image_img2img_pipeline(
    qwen_pipe: Any, strength: float, seed: int, cfg: float, negative: str | None
) -> None:
    from diffusers import QwenImageImg2ImgPipeline

    pixels = (np.random.RandomState(seed).rand(64, 96, 3) * 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    init = generation.vae_encode(qwen_pipe.vae, image, seed)
    (mine,), steps = ours(
        qwen_pipe, "a green tree", 96, 64, seed, cfg, negative, init_latents=init, strength=strength, steps=4
    )
    img2img = QwenImageImg2ImgPipeline(**qwen_pipe.components)
    img2img.set_progress_bar_config(disable=True)
    (stock,) = theirs(img2img, "a green tree", 96, 64, seed, cfg, negative, image=image, strength=strength, steps=4)
    assert max_diff(mine, stock) <= 1
    assert len(steps) == generation.steps_run(4, strength) == 4 - int(4 - 4 * strength)


def test_an_image_is_resized_as_the_img2img_pipeline_resizes_it(qwen_pipe: Any) -> None:
    """The encode takes the output size (the pipeline's height and width) and resizes the image to it first."""
    from diffusers import QwenImageImg2ImgPipeline

    image = Image.fromarray((np.random.RandomState(2).rand(80, 112, 3) * 255).astype(np.uint8))
    init = generation.vae_encode(qwen_pipe.vae, image, 4, width=64, height=64)
    assert init.shape == (1, 16, 8, 8)
    (mine,), _ = ours(qwen_pipe, "a cat", 64, 64, 4, 4.0, " ", init_latents=init, strength=0.7)
    img2img = QwenImageImg2ImgPipeline(**qwen_pipe.components)
    img2img.set_progress_bar_config(disable=True)
    (stock,) = theirs(img2img, "a cat", 64, 64, 4, 4.0, " ", image=image, strength=0.7)
    assert max_diff(mine, stock) <= 1


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
def test_bad_arguments_are_refused(qwen_pipe: Any) -> None:
    with pytest.raises(ValueError, match="multiples of 16"):
        ours(qwen_pipe, "a cat", 72, 64, 0, 4.0, None)
    with pytest.raises(ValueError, match="leaves no step"):
        ours(qwen_pipe, "a cat", 64, 64, 0, 4.0, None, init_latents=torch.zeros(1, 16, 8, 8), strength=0.0)
    with pytest.raises(ValueError, match="2 true CFG scales given for the 3 steps"):
        ours(qwen_pipe, "a cat", 64, 64, 0, [4.0, 4.0], " ")
    with pytest.raises(ValueError, match=r"1 step\(s\) leave this model's schedule undefined"):
        ours(qwen_pipe, "a cat", 64, 64, 0, 4.0, None, steps=1)
    with pytest.raises(ValueError, match="max_sequence_length"):
        generation.encode_prompt(qwen_pipe.text_encoder, qwen_pipe.tokenizer, "a", "cpu", max_sequence_length=0)


def test_the_demo_tokenizer_encodes_the_template_prefix_to_what_the_pipeline_drops(qwen_pipe: Any) -> None:
    check_template(qwen_pipe.tokenizer)
    assert qwen_pipe.prompt_template_encode_start_idx == TEMPLATE_PREFIX_TOKENS
    from transformers import Qwen2Tokenizer

    from invokeai.backend.models.tiny_tokenizers import build_qwen2_tokenizer

    bytes_only: Qwen2Tokenizer = build_qwen2_tokenizer("", "", 1024)
    with pytest.raises(ValueError, match=r"prefix to \d+ tokens; the pipeline drops 34"):
        check_template(bytes_only)


def test_preview_projection_is_fitted_on_the_denoisers_latents(qwen_pipe: Any) -> None:
    """Applied to the normalised latents the VAE makes for solid colours it was not fitted on, the map gives the
    colours back better than the best constant does (the demo VAE has random weights)."""
    from invokeai.backend.generation.preview import FIT_SIZE

    vae = qwen_pipe.vae
    projection = generation.preview_projection(vae)
    assert projection.channels == 16
    assert generation.known_preview_projection(vae) is projection
    colours = torch.rand(32, 3, generator=torch.Generator().manual_seed(5)) * 2 - 1
    frames = colours.view(-1, 3, 1, 1, 1).expand(-1, -1, 1, FIT_SIZE, FIT_SIZE)
    with torch.inference_mode():
        raw = vae.encode(frames).latent_dist.mode()[:, :, 0]
    mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1)
    cells = ((raw - mean) / std).permute(0, 2, 3, 1).reshape(len(colours), -1, 16)
    error = float((cells @ projection.weights + projection.bias - colours[:, None]).abs().mean())
    assert error < float((colours - colours.mean(dim=0)).abs().mean())
