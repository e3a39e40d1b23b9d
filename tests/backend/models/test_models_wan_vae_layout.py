"""Wan 2.1's causal VAE in its original names (ComfyUI's and Wan's single files) against diffusers' names: for the
published layout the mapping is diffusers' own converter's, and it goes both ways for any residual blocks per level."""

from __future__ import annotations

import pytest
import torch

from invokeai.backend.models import wan_vae_layout as layout


def _state(num_res_blocks: int, base_dim: int, dim_mult: list[int]) -> dict[str, torch.Tensor]:
    from diffusers import AutoencoderKLQwenImage

    with torch.device("meta"):
        model = AutoencoderKLQwenImage(base_dim=base_dim, dim_mult=dim_mult, num_res_blocks=num_res_blocks)
    return model.state_dict()


def test_the_published_layout_maps_as_diffusers_own_converter_reads_it() -> None:
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    state = _state(2, 96, [1, 2, 4, 4])
    original = layout.to_original(state, 2)
    assert layout.is_original_vae(original) and not layout.is_original_vae(state)
    assert "decoder.upsamples.14.residual.0.gamma" in original and "decoder.upsamples.3.resample.1.weight" in original
    assert not any(name.startswith("decoder.upsamples.15.") for name in original)
    assert sorted(convert_wan_vae_to_diffusers(dict(original))) == sorted(state)
    assert layout.from_original(original, 2).keys() == state.keys()


@pytest.mark.parametrize("num_res_blocks", [1, 3])
def test_other_residual_blocks_per_level_map_both_ways(num_res_blocks: int) -> None:
    state = _state(num_res_blocks, 8, [1, 2, 2, 2])
    original = layout.to_original(state, num_res_blocks)
    assert len(original) == len(state)
    assert not any("up_blocks" in name or "down_blocks" in name or "mid_block" in name for name in original)
    assert layout.from_original(original, num_res_blocks).keys() == state.keys()
