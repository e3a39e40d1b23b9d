"""The sdxl family descriptor: what it declares agrees with its parts, its shipped configs are real SDXL base and
the demo architecture, its folder check refuses what the nodes cannot run, and the demo builds deterministically."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import torch

from invokeai.backend.families.sdxl import demo, layout
from invokeai.backend.families.sdxl.descriptor import FAMILY, folder_differences


def _configs(folder: Path) -> dict[str, dict]:
    def read(component: str) -> dict:
        name = "scheduler_config.json" if component == "scheduler" else "config.json"
        return json.loads((folder / component / name).read_text(encoding="utf-8"))

    return {component: read(component) for component in FAMILY.checked_configs}


def test_the_descriptor_agrees_with_its_parts() -> None:
    assert FAMILY.name == "sdxl"
    assert FAMILY.pipeline_classes == ("StableDiffusionXLPipeline",)
    assert set(FAMILY.module_components) <= set(FAMILY.components)
    assert set(FAMILY.operations.values()) <= set(FAMILY.module_components)
    assert set(FAMILY.estimators) == set(FAMILY.runs) == set(FAMILY.operations)
    assert FAMILY.component_of("vae_decode") == "vae"
    assert FAMILY.constants.latent_scale == 8 and FAMILY.constants.latent_channels == 4
    assert dict(FAMILY.constants.text_lengths) == {"text_encoder": 77, "text_encoder_2": 77}
    (rule,) = FAMILY.files
    assert (rule.container, rule.format, rule.type) == ("safetensors", "checkpoint", "main")
    (model,) = FAMILY.demos
    assert (model.name, model.format, model.type) == ("demo-sdxl", "diffusers", "main")
    with pytest.raises(KeyError, match="known"):
        FAMILY.component_of("transformer")


def test_the_file_rule_takes_sgm_names_and_not_sd1_or_a_refiner() -> None:
    (rule,) = FAMILY.files
    sgm = [prefix + "x" for prefix in layout.CHECKPOINT_PREFIXES.values()]
    assert rule.matches(sgm)
    assert not rule.matches(["model.diffusion_model.x", "first_stage_model.x", "cond_stage_model.transformer.x"])
    refiner = ["model.diffusion_model.x", "first_stage_model.x", "conditioner.embedders.0.model.x"]
    assert not rule.matches(refiner)


def test_the_base_config_is_sdxl_base_and_runs() -> None:
    from diffusers import UNet2DConditionModel

    base = next(v for v in FAMILY.config_variants if v.name == "sdxl")
    assert folder_differences(_configs(base.path)) == []
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(base.component_config("unet"))
    # SDXL base 1.0's UNet: 2,567,463,684 parameters.
    assert sum(p.numel() for p in unet.parameters()) == 2_567_463_684
    signatures = [layout.checkpoint_signature(v) for v in FAMILY.config_variants]
    assert signatures[0] != signatures[1]


def test_the_folder_check_names_what_it_refuses(sdxl_folder: Path) -> None:
    configs = _configs(sdxl_folder)
    assert folder_differences(configs) == []
    inpaint = {**configs, "unet": {**configs["unet"], "in_channels": 9}}
    assert "inpainting" in " ".join(folder_differences(inpaint))
    vpred = {**configs, "scheduler": {**configs["scheduler"], "prediction_type": "v_prediction"}}
    assert "v_prediction" in " ".join(folder_differences(vpred))
    refiner = {**configs, "text_encoder": {}}
    assert "refiner" in " ".join(folder_differences(refiner))


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(file.relative_to(folder)).encode())
        h.update(file.read_bytes())
    return h.hexdigest()


def test_the_demo_builds_in_seconds_to_the_same_bytes(sdxl_folder: Path, tmp_path: Path) -> None:
    start = time.perf_counter()
    demo.build(tmp_path / "again")
    assert time.perf_counter() - start < 10
    assert _digest(tmp_path / "again") == _digest(sdxl_folder)
    shipped = next(v for v in FAMILY.config_variants if v.name == "sdxl-demo")
    for component in ("unet", "vae", "text_encoder", "text_encoder_2"):
        built = json.loads((sdxl_folder / component / "config.json").read_text(encoding="utf-8"))
        assert _architecture(built) == _architecture(shipped.component_config(component)), component


def _architecture(config: dict) -> dict:
    """A config without the library versions that wrote it: the shipped one was written by whatever transformers
    was installed then, and a newer one writes the same architecture under its own version."""
    return {key: value for key, value in config.items() if key not in ("transformers_version", "_diffusers_version")}
