"""The demo models load through load_component with the real classes, run forward, and generate images with the
stock diffusers pipelines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from models_testlib import DemoBuild

from invokeai.backend.models.loaders import components_of, load_component
from invokeai.backend.models.probe import probe_model


def _components(folder: Path, dtype: torch.dtype = torch.float32) -> dict[str, object]:
    probe = probe_model(folder)
    return {name: load_component(probe, name, device="cpu", dtype=dtype) for name in components_of(probe)}


@torch.no_grad()
def test_sd1_components_run_forward(demo_build: DemoBuild) -> None:
    parts = _components(demo_build.sd1)
    assert [type(parts[n]).__name__ for n in ("text_encoder", "tokenizer", "unet", "vae", "scheduler")] == [
        "CLIPTextModel",
        "CLIPTokenizer",
        "UNet2DConditionModel",
        "AutoencoderKL",
        "DDIMScheduler",
    ]
    ids = parts["tokenizer"]("a photo of a cat", padding="max_length", return_tensors="pt").input_ids
    text = parts["text_encoder"](ids).last_hidden_state
    assert text.shape == (1, 77, 32)
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    noise = parts["unet"](latents, 10, encoder_hidden_states=text).sample
    assert noise.shape == latents.shape and torch.isfinite(noise).all() and noise.abs().sum() > 0
    image = parts["vae"].decode(latents).sample
    assert image.shape == (1, 3, 64, 64) and torch.isfinite(image).all()


@torch.no_grad()
def test_krea2_components_run_forward(demo_build: DemoBuild) -> None:
    parts = _components(demo_build.krea2)
    assert [type(parts[n]).__name__ for n in ("text_encoder", "tokenizer", "transformer", "vae", "scheduler")] == [
        "Qwen3VLModel",
        "Qwen2Tokenizer",
        "Krea2Transformer2DModel",
        "AutoencoderKLQwenImage",
        "FlowMatchEulerDiscreteScheduler",
    ]
    ids = parts["tokenizer"]("a red cat", return_tensors="pt").input_ids
    states = parts["text_encoder"](input_ids=ids, output_hidden_states=True).hidden_states
    assert len(states) == 4 and states[3].shape == (1, ids.shape[1], 32)
    text = torch.stack([states[i] for i in (1, 2, 3)], dim=2)
    transformer = parts["transformer"]
    image_tokens = torch.randn(1, 16, 64, generator=torch.Generator().manual_seed(0))
    positions = torch.zeros(text.shape[1] + 16, 3)
    positions[text.shape[1] :, 1:] = torch.cartesian_prod(torch.arange(4.0), torch.arange(4.0))
    velocity = transformer(
        hidden_states=image_tokens, encoder_hidden_states=text, timestep=torch.tensor([0.5]), position_ids=positions
    ).sample
    assert velocity.shape == image_tokens.shape and torch.isfinite(velocity).all()
    decoded = parts["vae"].decode(torch.randn(1, 16, 1, 8, 8)).sample
    assert decoded.shape == (1, 3, 1, 64, 64)
    assert parts["scheduler"].config.use_dynamic_shifting


def test_components_load_in_the_requested_dtype(demo_build: DemoBuild) -> None:
    probe = probe_model(demo_build.krea2)
    transformer = load_component(probe, "transformer", dtype=torch.bfloat16)
    assert transformer.img_in.weight.dtype == torch.bfloat16
    # diffusers keeps the class's norm modules in float32 when loading in half precision.
    assert transformer.transformer_blocks[0].norm1.weight.dtype == torch.float32
    assert load_component(probe, "text_encoder", dtype=torch.bfloat16).dtype == torch.bfloat16


def test_sd1_pipeline_generates_an_image(demo_build: DemoBuild) -> None:
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(demo_build.sd1, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)

    def generate() -> np.ndarray:
        generator = torch.Generator().manual_seed(7)
        return pipe("a photo of a cat", height=64, width=64, num_inference_steps=4, generator=generator).images[0]

    image = generate()
    assert image.size == (64, 64)
    pixels = np.asarray(image)
    assert pixels.std() > 0
    assert np.array_equal(pixels, np.asarray(generate()))


def test_krea2_pipeline_generates_and_follows_the_prompt(demo_build: DemoBuild) -> None:
    from diffusers import Krea2Pipeline

    pipe = Krea2Pipeline.from_pretrained(demo_build.krea2, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)

    def generate(prompt: str) -> np.ndarray:
        generator = torch.Generator().manual_seed(7)
        result = pipe(
            prompt, height=64, width=64, num_inference_steps=3, max_sequence_length=16, generator=generator
        ).images[0]
        assert result.size == (64, 64)
        return np.asarray(result).astype(np.int16)

    cat, house = generate("a red cat"), generate("a blue house")
    assert np.abs(cat - house).max() > 0
    assert np.array_equal(cat, generate("a red cat"))

    # The sharp check of the tokenizer trap: the pipeline drops its first 34 tokens as the system prompt, so the
    # kept sequence must start at the prompt's first token and hold exactly the prompt plus the 5 suffix tokens.
    # (Images alone cannot tell: causal attention leaks the prompt into the suffix's states even when it is cut.)
    with torch.no_grad():
        red, red_mask = pipe.encode_prompt("red cat", max_sequence_length=16)
        blue, _ = pipe.encode_prompt("blue house", max_sequence_length=16)
    assert int(red_mask.sum()) == len(pipe.tokenizer("red cat").input_ids) + 5
    assert not torch.allclose(red[:, 0], blue[:, 0])


@pytest.mark.parametrize("component", ["unet", "vae"])
def test_a_gguf_or_pipeline_lacking_a_component_is_refused(demo_build: DemoBuild, component: str) -> None:
    from invokeai.backend.models.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match=f"has no {component}; it has transformer"):
        load_component(probe_model(demo_build.gguf), component)
