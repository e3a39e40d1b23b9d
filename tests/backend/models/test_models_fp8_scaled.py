"""ComfyUI's fp8 single files read back as ordinary weights: scaled float8 tensors times their scales (close to the
original), the marker and input scales dropped wherever the model's prefix puts them, other files untouched."""

from __future__ import annotations

import torch

from invokeai.backend.models.fp8_scaled import dequantized, is_fp8, scaled_fp8


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.diffusion_model.block.linear.weight": torch.randn(64, 32, generator=g) * 3,
        "model.diffusion_model.block.linear.bias": torch.randn(64, generator=g),
        "model.diffusion_model.norm.weight": torch.ones(32),
    }


def test_a_scaled_file_dequantizes_close_to_the_original() -> None:
    state = _state()
    stored = scaled_fp8(state, ["model.diffusion_model.block.linear.weight"])
    assert stored["model.diffusion_model.block.linear.weight"].dtype == torch.float8_e4m3fn
    assert is_fp8(stored) and not is_fp8(state)
    stored["model.diffusion_model.block.linear.scale_input"] = torch.tensor(1.0)
    back = dequantized(stored, torch.bfloat16)
    assert sorted(back) == sorted(state)
    weight = back["model.diffusion_model.block.linear.weight"]
    original = state["model.diffusion_model.block.linear.weight"]
    assert weight.dtype == torch.bfloat16
    # e4m3 keeps 3 mantissa bits: within 1/16 of each value, relative to the largest.
    assert float((weight.float() - original).abs().max()) < original.abs().max() / 16
    assert torch.equal(back["model.diffusion_model.norm.weight"], state["model.diffusion_model.norm.weight"])


def test_an_unscaled_fp8_tensor_is_cast_and_a_plain_file_passes_through() -> None:
    plain = _state()
    assert dequantized(plain, torch.float32) == plain
    unscaled = {**plain, "x.weight": torch.full((2, 2), 1.5).to(torch.float8_e4m3fn)}
    assert torch.equal(dequantized(unscaled, torch.float32)["x.weight"], torch.full((2, 2), 1.5))
