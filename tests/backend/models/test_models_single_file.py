"""An original-layout SD-1.5 single file (converted from demo-sd1) loads back through diffusers' from_single_file
with the shipped sd-1-demo config: the same weights, and the same image as the diffusers folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from models_testlib import DemoBuild

from invokeai.backend.families import config_variant
from invokeai.backend.models.loaders import components_of, load_component
from invokeai.backend.models.probe import probe_model


def test_checkpoint_holds_every_weight_in_the_original_layout(demo_build: DemoBuild, demo_checkpoint: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(demo_checkpoint), "pt") as file:
        keys = set(file.keys())
    assert "model.diffusion_model.input_blocks.3.0.op.weight" in keys  # first downsampler
    assert "model.diffusion_model.output_blocks.2.1.conv.weight" in keys  # upsampler of a block without attention
    assert "first_stage_model.decoder.up.3.upsample.conv.weight" in keys  # decoder blocks numbered backwards
    assert "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight" in keys
    folder_tensors = 0
    for weights in demo_build.sd1.rglob("*.safetensors"):
        with safe_open(str(weights), "pt") as file:
            folder_tensors += len(file.keys())
    assert len(keys) == folder_tensors


def test_single_file_components_equal_the_folders(demo_build: DemoBuild, demo_checkpoint: Path) -> None:
    single, folder = probe_model(demo_checkpoint), probe_model(demo_build.sd1)
    assert components_of(single) == components_of(folder)
    for name in ("unet", "vae", "text_encoder"):
        loaded, expected = load_component(single, name).state_dict(), load_component(folder, name).state_dict()
        assert loaded.keys() == expected.keys(), name
        assert all(torch.equal(loaded[key], expected[key]) for key in expected), name
    tokenizer = load_component(single, "tokenizer")
    assert tokenizer("a photo of a cat").input_ids == load_component(folder, "tokenizer")("a photo of a cat").input_ids
    assert type(load_component(single, "scheduler")).__name__ == "DDIMScheduler"
    assert load_component(single, "unet", dtype=torch.float16).conv_in.weight.dtype == torch.float16


def test_single_file_pipeline_makes_the_folders_image(demo_build: DemoBuild, demo_checkpoint: Path) -> None:
    from diffusers import StableDiffusionPipeline

    def image(pipe: StableDiffusionPipeline) -> np.ndarray:
        pipe.set_progress_bar_config(disable=True)
        generator = torch.Generator().manual_seed(11)
        return np.asarray(
            pipe("a red house", height=64, width=64, num_inference_steps=3, generator=generator).images[0]
        )

    from_file = StableDiffusionPipeline.from_single_file(
        str(demo_checkpoint), config=str(config_variant("sd-1-demo").path), local_files_only=True
    )
    from_folder = StableDiffusionPipeline.from_pretrained(demo_build.sd1, local_files_only=True)
    assert np.array_equal(image(from_file), image(from_folder))
