"""Shipped config variants: the real ones describe the real architectures, the demo ones the demo builds, and the
signature rule tells them apart."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from accelerate import init_empty_weights
from models_testlib import DemoBuild

from invokeai.backend.families import FAMILIES, config_variant, get_family
from invokeai.backend.families.krea2 import layout as krea2
from invokeai.backend.families.sd1 import layout as sd1
from invokeai.backend.families.sd1.convert import sd1_state_dicts_to_original
from invokeai.backend.models.config_variants import export_config_folder, match_variant, signature_mismatch
from invokeai.backend.models.errors import UnsupportedModelError

REPO = Path(__file__).resolve().parents[3]
# Written by whichever library version saved the file; not part of the architecture.
VERSION_KEYS = {"_diffusers_version", "transformers_version"}


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in state.items()}


def _without_versions(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_versions(v) for k, v in value.items() if k not in VERSION_KEYS}
    return value


@pytest.mark.parametrize(("variant", "build"), [("sd-1-demo", "sd1"), ("krea2-demo", "krea2")])
def test_demo_variants_are_the_demo_builds_configs(
    demo_build: DemoBuild, tmp_path: Path, variant: str, build: str
) -> None:
    export_config_folder(getattr(demo_build, build), tmp_path)
    shipped = config_variant(variant).path
    exported = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert exported == sorted(str(p.relative_to(shipped)) for p in shipped.rglob("*") if p.is_file())
    for name in exported:
        assert _without_versions(json.loads((tmp_path / name).read_text())) == _without_versions(
            json.loads((shipped / name).read_text())
        ), name


def test_sd1_variant_is_stable_diffusion_1_5() -> None:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    variant = config_variant("sd-1")
    with init_empty_weights():
        unet = UNet2DConditionModel.from_config(variant.component_config("unet"))
        vae = AutoencoderKL.from_config(variant.component_config("vae"))
        config = CLIPTextConfig.from_pretrained(str(variant.path), subfolder="text_encoder", local_files_only=True)
        text = CLIPTextModel(config)
    # Parameter counts of runwayml/stable-diffusion-v1-5's components.
    assert sum(p.numel() for p in unet.parameters()) == 859_520_964
    assert sum(p.numel() for p in vae.parameters()) == 83_653_863
    assert sum(p.numel() for p in text.parameters()) == 123_060_480
    # The signature derived from the configs holds for the model they build, in the original key layout.
    original = sd1_state_dicts_to_original(
        unet.state_dict(), vae.state_dict(), text.state_dict(), dict(unet.config), dict(vae.config)
    )
    assert signature_mismatch(sd1.checkpoint_signature(variant), _shapes(original)) is None
    assert (
        match_variant(get_family("sd-1").config_variants, _shapes(original), sd1.checkpoint_signature, "real").name
        == "sd-1"
    )


def test_krea2_variant_is_the_full_size_transformer() -> None:
    from diffusers import Krea2Transformer2DModel

    with init_empty_weights():
        model = Krea2Transformer2DModel.from_config(config_variant("krea2").component_config("transformer"))
    shapes = _shapes(model.state_dict())
    assert shapes["img_in.weight"] == (6144, 64)
    assert len(model.transformer_blocks) == 28
    assert (
        match_variant(get_family("krea2").config_variants, shapes, krea2.transformer_signature, "real").name == "krea2"
    )


def test_no_variant_matches_other_shapes(demo_checkpoint: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(demo_checkpoint), "pt") as file:
        shapes = {key: tuple(file.get_slice(key).get_shape()) for key in file.keys()}
    assert (
        match_variant(get_family("sd-1").config_variants, shapes, sd1.checkpoint_signature, "demo").name == "sd-1-demo"
    )
    # An inpainting UNet takes 9 input channels (latents, mask, masked image).
    shapes["model.diffusion_model.input_blocks.0.0.weight"] = (32, 9, 3, 3)
    with pytest.raises(UnsupportedModelError) as info:
        match_variant(get_family("sd-1").config_variants, shapes, sd1.checkpoint_signature, "inpaint.safetensors")
    assert "inpaint.safetensors matches no shipped sd-1 config" in info.value.reason
    assert "sd-1: model.diffusion_model.input_blocks.0.0.weight is [32, 9, 3, 3], expected [320, 4, 3, 3]" in str(
        info.value
    )
    assert "sd-1-demo: model.diffusion_model.input_blocks.0.0.weight is [32, 9, 3, 3], expected [32, 4, 3, 3]" in str(
        info.value
    )


def test_a_block_beyond_the_config_is_noticed() -> None:
    signature = {"blocks.0.w": (2, 2), "blocks.1.w": None}
    assert signature_mismatch(signature, {"blocks.0.w": (2, 2)}) is None
    assert "has blocks.1.w" in signature_mismatch(signature, {"blocks.0.w": (2, 2), "blocks.1.w": (2, 2)})
    assert signature_mismatch(signature, {}) == "lacks blocks.0.w"


def test_every_variant_folder_is_package_data() -> None:
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    suffixes = {glob.removeprefix("*") for glob in globs}
    for family in FAMILIES:
        # Every folder under a family's configs/ is one of its declared variants, and each holds configs only.
        roots = {variant.path.parent for variant in family.config_variants}
        folders = sorted(p.name for root in roots for p in root.iterdir())
        assert folders == sorted(v.name for v in family.config_variants), family.name
        files = [p for root in roots for p in root.rglob("*") if p.is_file()]
        assert files and all(p.suffix in suffixes for p in files), [p for p in files if p.suffix not in suffixes]
        assert not [p for p in files if p.suffix in {".safetensors", ".bin", ".gguf"}]
