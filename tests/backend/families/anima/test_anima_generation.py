"""Anima generation equals the stock AnimaModularPipeline's images (its guider ClassifierFreeGuidance at the same
scale): several sizes, seeds and guidance scales, with and without a negative prompt, an empty prompt (one masked
token), a prompt past the 512-token cut, and image-to-image, on demo-anima, CPU fp32, within 1/255 per pixel, served
by the installed attention dispatcher."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from invokeai.backend.attention import attention_caller, attention_stats, install_attention
from invokeai.backend.attention.testing import pristine_attention
from invokeai.backend.families.anima import generation
from invokeai.backend.families.anima.constants import CONDITIONING_TOKENS, MAX_SEQUENCE_LENGTH

STEPS = 3
LONG_PROMPT = "a painting of a green tree in the sky and a red house " * 60


def conditioning(pipe: Any, prompt: str) -> torch.Tensor:
    encoded = generation.encode_prompt(pipe.text_encoder, pipe.tokenizer, pipe.t5_tokenizer, prompt, "cpu")
    return generation.condition(pipe.text_conditioner, encoded, "cpu", torch.float32)


def ours(
    pipe: Any, prompt: str, width: int, height: int, seed: int, scale: float, negative: str | None, **kwargs: Any
) -> tuple[Image.Image, list]:
    steps: list = []
    negative_embeds = conditioning(pipe, negative or "") if scale > 1 else None
    latents = generation.denoise(
        pipe.transformer,
        pipe.scheduler,
        prompt_embeds=conditioning(pipe, prompt),
        negative_embeds=negative_embeds,
        width=width,
        height=height,
        steps=kwargs.pop("steps", STEPS),
        seed=seed,
        device="cpu",
        dtype=torch.float32,
        guidance_scale=scale,
        on_step=lambda step, total, lat: steps.append((step, total, tuple(lat.shape))),
        **kwargs,
    )
    return generation.vae_decode(pipe.vae, latents), steps


def theirs(pipe: Any, prompt: str, width: int, height: int, seed: int, scale: float, negative: Any, **kw: Any) -> Any:
    from diffusers import ClassifierFreeGuidance

    pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=scale))
    if negative is not None:
        kw["negative_prompt"] = negative
    generator = torch.Generator("cpu").manual_seed(seed)
    return pipe(
        prompt=prompt, num_inference_steps=kw.pop("steps", STEPS), width=width, height=height, generator=generator,
        output="images", **kw,
    )[0]  # fmt: skip


def max_diff(a: Image.Image, b: Image.Image) -> int:
    return int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())


@pytest.mark.parametrize(
    ("width", "height", "seed", "scale", "prompt", "negative"),
    [
        (64, 48, 1, 4.5, "a red cat", None),
        (96, 64, 7, 3.0, "a blue dog in the house", "blurry, low quality"),
        (48, 80, 3, 1.0, "a tree", None),
        (64, 64, 0, 4.5, "", ""),
    ],
)
def test_text_to_image_equals_anima_modular_pipeline(
    anima_pipe: Any, width: int, height: int, seed: int, scale: float, prompt: str, negative: str | None
) -> None:
    mine, steps = ours(anima_pipe, prompt, width, height, seed, scale, negative)
    assert max_diff(mine, theirs(anima_pipe, prompt, width, height, seed, scale, negative)) <= 1
    assert steps == [(i + 1, STEPS, (1, 16, height // 8, width // 8)) for i in range(STEPS)]


def test_calls_go_through_the_installed_dispatcher(anima_pipe: Any) -> None:
    """The masked text encoder (an empty prompt), the adapter's masked calls and the DiT's unmasked ones are all
    served by the installed dispatcher, and the image still equals the pipeline's."""
    with pristine_attention():
        install_attention("auto", "cpu")
        with attention_caller("anima-served"):
            mine, _ = ours(anima_pipe, "a red cat", 64, 64, 5, 4.5, "")
        served = attention_stats().counts["anima-served"]
        stock = theirs(anima_pipe, "a red cat", 64, 64, 5, 4.5, "")
    assert sum(served.values()) > 0
    assert max_diff(mine, stock) <= 1


def test_a_prompt_over_the_limit_is_cut_to_512_tokens(anima_pipe: Any) -> None:
    encoded = generation.encode_prompt(
        anima_pipe.text_encoder, anima_pipe.tokenizer, anima_pipe.t5_tokenizer, LONG_PROMPT, "cpu"
    )
    assert encoded["qwen_mask"].shape == (1, MAX_SEQUENCE_LENGTH) and encoded["t5_ids"].shape == (
        1,
        MAX_SEQUENCE_LENGTH,
    )
    embeds = generation.condition(anima_pipe.text_conditioner, encoded, "cpu", torch.float32)
    assert embeds.shape == (1, CONDITIONING_TOKENS, anima_pipe.transformer.config.text_embed_dim)
    mine, _ = ours(anima_pipe, LONG_PROMPT, 48, 48, 2, 4.5, None, steps=2)
    assert max_diff(mine, theirs(anima_pipe, LONG_PROMPT, 48, 48, 2, 4.5, None, steps=2)) <= 1


def test_the_prompt_and_guidance_change_the_latents(anima_pipe: Any) -> None:
    def latents(prompt: str, scale: float, negative: str | None) -> torch.Tensor:
        return generation.denoise(
            anima_pipe.transformer, anima_pipe.scheduler, prompt_embeds=conditioning(anima_pipe, prompt),
            negative_embeds=None if negative is None else conditioning(anima_pipe, negative), width=32, height=32,
            steps=2, seed=0, device="cpu", dtype=torch.float32, guidance_scale=scale,
        )  # fmt: skip

    cat = latents("a cat", 1.0, None)
    assert not torch.equal(cat, latents("a dog", 1.0, None))
    assert not torch.equal(cat, latents("a cat", 4.5, ""))
    assert torch.equal(cat, latents("a cat", 1.0, "a dog"))  # no guidance at 1: the negative is not used


@pytest.mark.parametrize(("strength", "seed", "scale"), [(0.6, 4, 4.5), (0.9, 11, 1.0)])
def test_image_to_image_equals_the_pipeline_given_an_image(
    anima_pipe: Any, strength: float, seed: int, scale: float
) -> None:
    image = Image.fromarray(np.linspace(0, 255, 64 * 48 * 3).reshape(48, 64, 3).astype(np.uint8))
    latents = generation.vae_encode(anima_pipe.vae, image)
    negative = conditioning(anima_pipe, "") if scale > 1 else None
    out = generation.denoise(
        anima_pipe.transformer, anima_pipe.scheduler, prompt_embeds=conditioning(anima_pipe, "a cat"),
        negative_embeds=negative, width=64, height=48, steps=4, seed=seed, device="cpu", dtype=torch.float32,
        guidance_scale=scale, init_latents=latents, strength=strength,
    )  # fmt: skip
    mine = generation.vae_decode(anima_pipe.vae, out)
    stock = theirs(anima_pipe, "a cat", 64, 48, seed, scale, None, steps=4, image=image, strength=strength)
    assert max_diff(mine, stock) <= 1


def test_a_padding_mask_transformer_runs_without_torchvision(anima_pipe: Any) -> None:
    """Anima's own config concatenates the (all-zero) padding mask, which diffusers resizes with torchvision: the
    server runs it without, and the zero channel changes nothing: the same DiT with its weights for that channel
    makes the demo's latents."""
    from invokeai.backend.families.anima import demo

    masked = demo.build_transformer(concat_padding_mask=True)
    state = anima_pipe.transformer.state_dict()
    weight = masked.patch_embed.proj.weight.detach().clone()
    # The patch embedding's input is (channels + 1) x 4 cells, channel-major: keep the demo's weights for the 16
    # latent channels, whatever the mask channel's are.
    cells = 4
    weight[:, : 16 * cells] = state["patch_embed.proj.weight"]
    masked.load_state_dict({**state, "patch_embed.proj.weight": weight})

    def run(transformer: Any) -> torch.Tensor:
        return generation.denoise(
            transformer, anima_pipe.scheduler, prompt_embeds=conditioning(anima_pipe, "a cat"), width=32, height=32,
            steps=2, seed=3, device="cpu", dtype=torch.float32,
        )  # fmt: skip

    assert torch.allclose(run(masked), run(anima_pipe.transformer), atol=1e-5)


def test_bad_arguments_are_refused(anima_pipe: Any) -> None:
    with pytest.raises(ValueError, match="multiples of 16"):
        ours(anima_pipe, "a cat", 72, 64, 0, 4.5, None)
    with pytest.raises(ValueError, match="negative embeddings"):
        generation.denoise(
            anima_pipe.transformer, anima_pipe.scheduler, prompt_embeds=conditioning(anima_pipe, "a cat"), width=32,
            height=32, steps=2, seed=0, device="cpu", dtype=torch.float32, guidance_scale=4.5,
        )  # fmt: skip


def test_lcm_samples_deterministically_from_the_seed(anima_pipe: Any) -> None:
    """LCM re-noises each step's clean estimate with the seed's generator: the same seed gives the same latents,
    another seed others, and neither is Euler's."""
    from invokeai.backend.families.anima.descriptor import make_scheduler

    lcm = make_scheduler("lcm", dict(anima_pipe.scheduler.config))

    def run(scheduler: Any, seed: int) -> torch.Tensor:
        return generation.denoise(
            anima_pipe.transformer, scheduler, prompt_embeds=conditioning(anima_pipe, "a cat"), width=32, height=32,
            steps=3, seed=seed, device="cpu", dtype=torch.float32,
        )  # fmt: skip

    assert torch.equal(run(lcm, 1), run(lcm, 1))
    assert not torch.equal(run(lcm, 1), run(lcm, 2))
    assert not torch.equal(run(lcm, 1), run(anima_pipe.scheduler, 1))
