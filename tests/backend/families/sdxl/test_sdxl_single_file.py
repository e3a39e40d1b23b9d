"""SDXL single files in the original SGM layout: written from the demo folder, recognised, matched to their shipped
config, and loaded back (fp32 and the fp16 files people download) with the folder's weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from invokeai.backend.families.sdxl import layout
from invokeai.backend.families.sdxl.load_checkpoint import load_checkpoint_component
from invokeai.backend.models.config_variants import ConfigVariant, signature_mismatch

CONFIGS = Path(layout.__file__).parent / "configs"
DEMO = ConfigVariant("sdxl-demo", "sdxl", "demo", CONFIGS / "sdxl-demo")
BASE = ConfigVariant("sdxl", "sdxl", "base", CONFIGS / "sdxl")
MODULES = ("unet", "vae", "text_encoder", "text_encoder_2")


@pytest.fixture(scope="module", params=[torch.float32, torch.float16], ids=["fp32", "fp16"])
def checkpoint(request: pytest.FixtureRequest, sdxl_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    label = "fp16" if request.param == torch.float16 else "fp32"
    dest = tmp_path_factory.mktemp("sdxl-file") / f"demo-sdxl-{label}.safetensors"
    return layout.pipeline_to_checkpoint(sdxl_folder, dest, dtype=request.param)


def _names_and_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), framework="pt") as file:
        return {key: tuple(file.get_slice(key).get_shape()) for key in file.keys()}


def test_the_file_is_in_the_sgm_layout_and_matches_the_demo_config_only(checkpoint: Path) -> None:
    shapes = _names_and_shapes(checkpoint)
    assert layout.is_checkpoint(shapes)
    assert any(name.endswith("attn.in_proj_weight") for name in shapes)
    assert f"{layout.UNET_PREFIX}label_emb.0.0.weight" in shapes
    assert signature_mismatch(layout.checkpoint_signature(DEMO), shapes) is None
    assert signature_mismatch(layout.checkpoint_signature(BASE), shapes) is not None
    with safe_open(str(checkpoint), framework="pt") as file:
        dtypes = {file.get_slice(key).get_dtype() for key in file.keys()}
    assert dtypes == ({"F16"} if "fp16" in checkpoint.name else {"F32"})


def test_an_sd1_layout_is_not_sdxl() -> None:
    names = ["model.diffusion_model.x", "first_stage_model.x", "cond_stage_model.transformer.text_model.x"]
    assert not layout.is_checkpoint(names)
    assert "text_encoder_2" in " ".join(layout.missing_checkpoint_parts(names))


@pytest.mark.parametrize("component", MODULES)
def test_loading_the_file_gives_the_folders_weights_in_fp32(
    checkpoint: Path, sdxl_parts: dict[str, Any], component: str
) -> None:
    loaded = load_checkpoint_component(checkpoint, DEMO, component, torch.float32)
    expected = sdxl_parts[component].state_dict()
    got = loaded.state_dict()
    assert sorted(got) == sorted(expected)
    fp16 = "fp16" in checkpoint.name
    for name, tensor in expected.items():
        assert got[name].dtype == torch.float32, name
        want = tensor.half().float() if fp16 and tensor.is_floating_point() else tensor
        assert torch.equal(got[name], want), name


def test_diffusers_pipeline_from_single_file_reads_the_same_weights(checkpoint: Path, sdxl_parts: dict[str, Any]):
    if "fp16" in checkpoint.name:
        pytest.skip("the fp32 file is the converter's check")
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_single_file(
        str(checkpoint), config=str(DEMO.path), local_files_only=True, torch_dtype=torch.float32
    )
    for component in MODULES:
        got = getattr(pipe, component).state_dict()
        for name, tensor in sdxl_parts[component].state_dict().items():
            assert torch.equal(got[name], tensor), f"{component}.{name}"


def test_tokenizers_and_scheduler_come_from_the_variant(checkpoint: Path, sdxl_parts: dict[str, Any]) -> None:
    tokenizer_2 = load_checkpoint_component(checkpoint, DEMO, "tokenizer_2", torch.float32)
    assert tokenizer_2.pad_token == "!"
    scheduler = load_checkpoint_component(checkpoint, DEMO, "scheduler", torch.float32)
    assert dict(scheduler.config) == dict(sdxl_parts["scheduler"].config)
