"""FLUX.1's VAE as Black Forest Labs ship it (ae.safetensors, original LDM names, 16 latent channels, no quant
convs): recognised by its tensor names, paired by its shapes with a shipped config (full size: flux, the first of
flux and flux-schnell, which have the same VAE; the demo's: flux-demo), loaded bit-equal into the AutoencoderKL that
decodes as the pipeline's does; an SD-1/SDXL-style VAE of 4 latent channels is refused saying so, unless another
family's rule takes it."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from invokeai.backend.families.family import FileRule
from invokeai.backend.families.flux import layout
from invokeai.backend.families.flux.descriptor import CONFIG_VARIANTS, FAMILY
from invokeai.backend.models import probe as probe_module
from invokeai.backend.models.errors import UnsupportedModelError
from invokeai.backend.models.loaders import components_of, load_component
from invokeai.backend.models.original_sd_layout import VAE_RESNET_NAMES, rename_to_original, vae_key_map
from invokeai.backend.models.probe import probe_model
from invokeai.backend.models.safetensors_header import DTYPE_SIZES

VARIANTS = {variant.name: variant for variant in CONFIG_VARIANTS}
SD_VAE = dict(
    latent_channels=4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
)


def kind(path: Path) -> tuple[Any, ...]:
    probe = probe_model(path)
    return probe.family, probe.type, probe.format, probe.config_variant


def sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "F32") -> Path:
    """A safetensors file with these tensors' header and a hole for their data: a real-size file's layout, as the
    probe reads it, at no disk cost."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * DTYPE_SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        file.truncate(8 + len(raw) + offset)
    return path


def original_vae_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of an AutoencoderKL of this config in the original names (no weights)."""
    from diffusers import AutoencoderKL

    with torch.device("meta"):
        vae = AutoencoderKL.from_config(config)
    original = rename_to_original(vae.state_dict(), vae_key_map(dict(vae.config)), "", VAE_RESNET_NAMES)
    return {name: tuple(tensor.shape) for name, tensor in original.items()}


@pytest.fixture(scope="module")
def demo_vae(demo_flux: Path) -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(demo_flux, subfolder="vae", torch_dtype=torch.float32).eval()


def test_the_demos_vae_as_ae_safetensors_is_a_flux_vae_and_loads_bit_equal(demo_vae: Any, tmp_path: Path) -> None:
    path = tmp_path / "ae.safetensors"
    layout.write_original_vae(demo_vae, path)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as file:
        names = set(file.keys())
    assert {"encoder.down.0.block.0.conv1.weight", "decoder.up.3.block.1.conv2.weight"} <= names
    assert not any(name.startswith(("quant_conv.", "post_quant_conv.")) or "down_blocks" in name for name in names)
    assert kind(path) == ("flux", "vae", "checkpoint", "flux-demo")
    probe = probe_model(path)
    assert components_of(probe) == ("vae",)
    loaded = load_component(probe, "vae")
    assert type(loaded).__name__ == "AutoencoderKL" and loaded.config.latent_channels == 16
    state = loaded.state_dict()
    assert sorted(state) == sorted(demo_vae.state_dict())
    for name, tensor in demo_vae.state_dict().items():
        assert torch.equal(state[name], tensor), name
    latents = torch.randn(1, 16, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(loaded.decode(latents).sample, demo_vae.decode(latents).sample)


def test_the_full_size_ae_picks_flux_of_the_two_configs_it_fits(tmp_path: Path) -> None:
    shapes = original_vae_shapes(VARIANTS["flux"].component_config("vae"))
    assert shapes["encoder.conv_out.weight"] == (32, 512, 3, 3) and "quant_conv.weight" not in shapes
    assert VARIANTS["flux"].component_config("vae") == VARIANTS["flux-schnell"].component_config("vae")
    for _ in range(2):  # the same answer every time
        assert kind(sparse_safetensors(tmp_path / "ae.safetensors", shapes)) == ("flux", "vae", "checkpoint", "flux")


def test_an_sd_vae_of_4_latent_channels_is_refused_saying_so(tmp_path: Path) -> None:
    shapes = original_vae_shapes(SD_VAE)
    assert layout.is_original_vae(shapes)  # the names are any LDM VAE's
    with pytest.raises(UnsupportedModelError, match=r"a VAE of 4 latent channels .* not FLUX\.1's VAE") as info:
        probe_model(sparse_safetensors(tmp_path / "sdxl_vae.safetensors", shapes))
    assert "encoder.conv_out.weight is [8, 512, 3, 3]" in str(info.value)


def test_a_vae_file_another_familys_rule_takes_is_not_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe tries every rule that recognises the names: one refusing by shape leaves the file to the next."""
    path = sparse_safetensors(tmp_path / "sd_vae.safetensors", original_vae_shapes(SD_VAE))
    with pytest.raises(UnsupportedModelError):
        probe_model(path)
    claimed = FileRule(
        container="safetensors",
        format="checkpoint",
        type="vae",
        what="a 4-channel VAE",
        components=("vae",),
        matches=layout.is_original_vae,
        signature=lambda variant: {"encoder.conv_out.weight": (8, 512, 3, 3)},
        load=lambda *args: None,
    )
    other = dataclasses.replace(FAMILY, name="other", files=(claimed,))
    monkeypatch.setattr(probe_module, "FAMILIES", (*probe_module.FAMILIES, other))
    result = probe_model(path)
    assert (result.family, result.type, result.config_variant) == ("other", "vae", "flux")
