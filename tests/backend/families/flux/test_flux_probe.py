"""FLUX.1 files are recognised by the generic probe through the family's descriptor: the diffusers folder, a BFL
safetensors transformer and a BFL GGUF transformer; a FluxPipeline folder that is another model is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from invokeai.backend.families.flux import demo, layout
from invokeai.backend.models.errors import UnsupportedModelError
from invokeai.backend.models.loaders import load_component
from invokeai.backend.models.probe import probe_model


def kind(path: Path) -> tuple:
    probe = probe_model(path)
    return probe.family, probe.type, probe.format, probe.config_variant


def test_the_demo_folder_is_a_flux_pipeline(demo_flux: Path) -> None:
    assert kind(demo_flux) == ("flux", "main", "diffusers", None)


def test_bfl_files_are_flux_transformers_of_the_demo_config(tmp_path: Path) -> None:
    transformer = demo.build_transformer()
    single = tmp_path / "flux.safetensors"
    layout.write_bfl_safetensors(transformer, single, prefix=layout.PREFIX)
    assert kind(single) == ("flux", "transformer", "checkpoint", "flux-demo")
    quantized = tmp_path / "flux.gguf"
    demo.build_gguf(quantized)
    assert kind(quantized) == ("flux", "transformer", "gguf", "flux-demo")
    loaded = load_component(probe_model(single), "transformer")
    assert type(loaded).__name__ == "FluxTransformer2DModel"


def test_a_fill_like_transformer_folder_is_refused_by_name(demo_flux: Path, tmp_path: Path) -> None:
    folder = tmp_path / "fill"
    shutil.copytree(demo_flux, folder)
    config_path = folder / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config["in_channels"] = 128
    config_path.write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="its transformer takes 128 input channels"):
        probe_model(folder)
