"""What InvokeAI's records say of a model beyond its layout, as each family's `invokeai.describe` reads it from the
configs: the variant, the prediction type and the default settings, the way InvokeAI 6.14.2's probe decides them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from invokeai.backend.families import ModelOnDisk, RecordFacts, get_family
from invokeai.backend.families.registry import FAMILIES
from invokeai.backend.models.describe import describe_model
from invokeai.backend.models.probe import ProbeResult


def on_disk(
    configs: dict[str, dict[str, Any]], type: str = "main", name: str = "m", single: bool = False
) -> ModelOnDisk:
    return ModelOnDisk(read=lambda part: configs.get(part, {}), type=type, name=name, single_file=single)


def facts(family: str, model: ModelOnDisk) -> RecordFacts:
    return get_family(family).invokeai.describe(model)


@pytest.mark.parametrize("family", ["sd-1", "sdxl"])
def test_sd_variant_from_the_unet_and_prediction_from_the_scheduler(family: str) -> None:
    normal = facts(family, on_disk({"unet": {"in_channels": 4}, "scheduler": {"prediction_type": "epsilon"}}))
    assert (normal.variant, normal.prediction_type) == ("normal", "epsilon")
    inpaint = facts(family, on_disk({"unet": {"in_channels": 9}, "scheduler": {"prediction_type": "v_prediction"}}))
    assert (inpaint.variant, inpaint.prediction_type) == ("inpaint", "v_prediction")
    # No prediction_type in the scheduler: InvokeAI's default, epsilon.
    assert facts(family, on_disk({"unet": {"in_channels": 4}})).prediction_type == "epsilon"
    size = 512 if family == "sd-1" else 1024
    assert normal.default_settings == {"width": size, "height": size}


def test_flux_variant_from_the_transformer() -> None:
    assert facts("flux", on_disk({"transformer": {"guidance_embeds": True}})).variant == "dev"
    assert facts("flux", on_disk({"transformer": {"guidance_embeds": False}})).variant == "schnell"
    assert facts("flux", on_disk({"transformer": {"guidance_embeds": True, "in_channels": 384}})).variant == "dev_fill"
    assert facts("flux", on_disk({}, type="vae", single=True)).variant is None


def test_zimage_variant_from_the_scheduler_shift_and_its_defaults() -> None:
    turbo = facts("z-image", on_disk({"scheduler": {"shift": 3.0}}))
    base = facts("z-image", on_disk({"scheduler": {"shift": 6.0}}))
    assert (turbo.variant, base.variant) == ("turbo", "zbase")
    assert (turbo.default_settings or {})["steps"] == 9 and (base.default_settings or {})["steps"] == 50
    # A single transformer file has no scheduler of its own: InvokeAI records it as Turbo.
    assert facts("z-image", on_disk({"scheduler": {"shift": 6.0}}, type="transformer", single=True)).variant == "turbo"


def test_krea2_variant_from_is_distilled_or_the_file_name() -> None:
    assert facts("krea2", on_disk({"model_index": {"is_distilled": True}})).variant == "krea2_turbo"
    assert facts("krea2", on_disk({"model_index": {"is_distilled": False}})).variant == "krea2_base"
    for name, variant in [
        ("Krea-2-Raw-Q8.gguf", "krea2_base"),
        ("krea2_base_q4.gguf", "krea2_base"),
        ("krea2-turbo-baseline.gguf", "krea2_turbo"),
        ("krea2-database.gguf", "krea2_turbo"),
    ]:
        assert facts("krea2", on_disk({}, type="transformer", name=name, single=True)).variant == variant


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_every_shipped_config_is_described_without_error(family: Any) -> None:
    for variant in family.config_variants:
        probe = ProbeResult(Path("/nowhere/model.safetensors"), family.name, "main", "checkpoint", variant.name, 1)
        assert isinstance(describe_model(probe), RecordFacts)


def test_a_diffusers_folder_is_read_from_its_own_configs(tmp_path: Path) -> None:
    """describe_model reads a folder's configs (not a shipped one's): a scheduler rewritten to v_prediction shows."""
    family = get_family("sd-1")
    shutil.copytree(family.config_variants[0].path, tmp_path / "sd")
    scheduler = tmp_path / "sd" / "scheduler" / "scheduler_config.json"
    scheduler.write_text(json.dumps({**json.loads(scheduler.read_text()), "prediction_type": "v_prediction"}))
    probe = ProbeResult(tmp_path / "sd", "sd-1", "main", "diffusers", None, 1)
    assert describe_model(probe).prediction_type == "v_prediction"
    (tmp_path / "sd" / "unet" / "config.json").write_text("not json")
    assert describe_model(probe).variant == "normal"  # unreadable: InvokeAI's default reading
