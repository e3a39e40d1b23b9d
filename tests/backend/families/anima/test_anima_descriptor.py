"""Anima's folder check refuses what its nodes do not run, naming what was expected: another family's component in
an Anima folder, components whose widths do not chain (a mismatched pair), another scheduler; the shipped configs
(full size and demo) pass it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from invokeai.backend.families import config_variant
from invokeai.backend.families.anima.descriptor import FAMILY, folder_check


def configs(variant: str) -> dict[str, dict[str, Any]]:
    v = config_variant(variant)
    found = {name: v.component_config(name) for name in FAMILY.checked_configs if name != "scheduler"}
    found["scheduler"] = json.loads((v.path / "scheduler" / "scheduler_config.json").read_text())
    return found


@pytest.mark.parametrize("variant", ["anima", "anima-demo"])
def test_the_shipped_configs_pass(variant: str) -> None:
    assert folder_check(configs(variant)) == []


def test_another_familys_component_is_refused_naming_the_class_expected() -> None:
    found = configs("anima-demo")
    found["vae"] = {"_class_name": "AutoencoderKL", "latent_channels": 16}
    assert folder_check(found) == ["its vae is AutoencoderKL; Anima's vae is AutoencoderKLQwenImage"]
    found = configs("anima-demo")
    found["transformer"] = {"_class_name": "QwenImageTransformer2DModel"}
    assert folder_check(found) == [
        "its transformer is QwenImageTransformer2DModel; Anima's transformer is CosmosTransformer3DModel"
    ]


def test_a_mismatched_pair_is_refused_naming_both_widths() -> None:
    found = configs("anima-demo")
    found["text_encoder"] = configs("anima")["text_encoder"]  # Qwen3-0.6B's 1024-wide states into the demo adapter
    assert folder_check(found) == ["its text encoder's states are 1024 wide, its text conditioner takes 32"]
    found = configs("anima-demo")
    found["transformer"] = configs("anima")["transformer"]  # a full-size DiT after the demo adapter
    assert folder_check(found) == ["its text conditioner makes 32-wide conditioning, its transformer takes 1024"]


def test_another_scheduler_is_refused() -> None:
    found = configs("anima-demo")
    found["scheduler"] = {"_class_name": "DPMSolverMultistepScheduler"}
    assert folder_check(found) == [
        "its scheduler is DPMSolverMultistepScheduler; Anima samples with FlowMatchEulerDiscreteScheduler"
    ]
