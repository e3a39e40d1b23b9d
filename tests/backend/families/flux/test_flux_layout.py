"""FLUX.1 transformer files in Black Forest Labs names: what `to_bfl` writes is what diffusers' own converter
reads, and safetensors and GGUF files (with and without the checkpoint prefix) load back to the same model; their
shapes pick the right shipped config (dev, schnell, demo)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from invokeai.backend.families.flux import demo, layout
from invokeai.backend.families.flux.descriptor import CONFIG_VARIANTS
from invokeai.backend.models.config_variants import ConfigVariant, signature_mismatch
from invokeai.backend.models.gguf_header import read_gguf_header

VARIANTS = {variant.name: variant for variant in CONFIG_VARIANTS}
REAL_WIDTH, REAL_MLP = 3072, 12288  # what diffusers' converter assumes when it splits a single block's linear1


@pytest.fixture(scope="module")
def transformer() -> Any:
    return demo.build_transformer()


def forward(model: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        return model(
            hidden_states=torch.randn(1, 16, 64, generator=g),
            encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
            pooled_projections=torch.randn(1, 32, generator=g),
            timestep=torch.tensor([0.5]),
            guidance=torch.tensor([3.5]),
            img_ids=torch.zeros(16, 3),
            txt_ids=torch.zeros(8, 3),
            return_dict=False,
        )[0]


def test_bfl_names_are_what_diffusers_own_converter_reads(transformer: Any) -> None:
    """diffusers splits a single block's linear1 at FLUX.1's width, so the single blocks get tensors of that many
    rows (diffusers' converter reads rows only); everything must come back under its diffusers name, equal."""
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    original = dict(transformer.state_dict())
    g = torch.Generator().manual_seed(1)
    for i in range(demo.TRANSFORMER["num_single_layers"]):
        block = f"single_transformer_blocks.{i}."
        for part, rows in (("attn.to_q", REAL_WIDTH), ("attn.to_k", REAL_WIDTH), ("attn.to_v", REAL_WIDTH)):
            original[f"{block}{part}.weight"] = torch.randn(rows, 4, generator=g)
            original[f"{block}{part}.bias"] = torch.randn(rows, generator=g)
        original[f"{block}proj_mlp.weight"] = torch.randn(REAL_MLP, 4, generator=g)
        original[f"{block}proj_mlp.bias"] = torch.randn(REAL_MLP, generator=g)
    bfl = {layout.PREFIX + name: tensor for name, tensor in layout.to_bfl(original).items()}
    converted = convert_flux_transformer_checkpoint_to_diffusers(dict(bfl))
    assert sorted(converted) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(converted[name], tensor), name


@pytest.mark.parametrize("prefix", ["", layout.PREFIX])
def test_a_bfl_safetensors_file_loads_back_to_the_same_transformer(
    transformer: Any, tmp_path: Path, prefix: str
) -> None:
    from safetensors import safe_open

    path = tmp_path / "flux.safetensors"
    layout.write_bfl_safetensors(transformer, path, prefix=prefix)
    with safe_open(str(path), "pt") as f:
        names = list(f.keys())
    assert layout.is_bfl_transformer(names)
    assert any(name.startswith(prefix + "double_blocks.0.img_attn.qkv") for name in names)
    loaded = layout.load_bfl_safetensors(path, VARIANTS["flux-demo"], torch.float32)
    assert type(loaded).__name__ == "FluxTransformer2DModel"
    expected = transformer.state_dict()
    actual = loaded.state_dict()
    assert sorted(actual) == sorted(expected)
    assert all(torch.equal(actual[name], expected[name]) for name in expected)
    # The weights are equal bit for bit (above); the outputs may differ in the last bits where the CPU's kernels
    # take another path for tensors that start at another alignment (seen with one prefix and not the other).
    torch.testing.assert_close(forward(loaded), forward(transformer), rtol=1e-5, atol=1e-6)


def test_a_gguf_file_in_the_converters_layout_loads_through_diffusers_gguf_quantizer(
    transformer: Any, tmp_path: Path
) -> None:
    from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter

    path = tmp_path / "flux.gguf"
    stored = layout.write_bfl_gguf(transformer, path)
    header = read_gguf_header(path)
    assert layout.is_bfl_transformer(header.tensors)
    # Every 2-D tensor (FLUX's Linear weights, modulation included) is quantized; 1-D ones stay F32.
    for name, info in header.tensors.items():
        assert info.quant_type == ("Q8_0" if len(info.shape) == 2 else "F32"), name
        assert stored[name] == info.quant_type
    loaded = layout.load_bfl_gguf(path, VARIANTS["flux-demo"], torch.float32)
    assert isinstance(loaded.transformer_blocks[0].attn.to_q, GGUFLinear)
    assert isinstance(loaded.single_transformer_blocks[0].proj_mlp.weight, GGUFParameter)
    plain = [p for m in loaded.modules() for n, p in m.named_parameters(recurse=False) if not isinstance(m, GGUFLinear)]
    assert plain and not any(isinstance(p, GGUFParameter) for p in plain)
    reference = forward(transformer)
    error = (forward(loaded) - reference).abs().max()
    assert 0 < error < 0.05 * reference.abs().max()


def shapes_of(model: Any) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in layout.to_bfl(model.state_dict()).items()}


def test_the_demo_transformer_matches_the_demo_config_only(transformer: Any) -> None:
    shapes = shapes_of(transformer)
    assert signature_mismatch(layout.transformer_signature(VARIANTS["flux-demo"]), shapes) is None
    for name in ("flux", "flux-schnell"):
        assert signature_mismatch(layout.transformer_signature(VARIANTS[name]), shapes) is not None


@pytest.mark.parametrize(("variant", "other"), [("flux", "flux-schnell"), ("flux-schnell", "flux")])
def test_dev_and_schnell_files_are_told_apart_by_the_guidance_embedder(variant: str, other: str) -> None:
    """The shapes of a full-size file, from the shipped config on the meta device (no weights)."""
    from accelerate import init_empty_weights
    from diffusers import FluxTransformer2DModel

    chosen: ConfigVariant = VARIANTS[variant]
    with init_empty_weights():
        model = FluxTransformer2DModel.from_config(FluxTransformer2DModel.load_config(chosen.path / "transformer"))
    shapes = shapes_of(model)
    assert shapes["double_blocks.18.img_attn.qkv.weight"] == (3 * REAL_WIDTH, REAL_WIDTH)
    assert shapes["single_blocks.37.linear1.weight"] == (3 * REAL_WIDTH + REAL_MLP, REAL_WIDTH)
    assert signature_mismatch(layout.transformer_signature(chosen), shapes) is None
    assert "guidance_in" in (signature_mismatch(layout.transformer_signature(VARIANTS[other]), shapes) or "")


def test_a_file_that_is_not_a_bfl_transformer_is_refused_by_name(transformer: Any) -> None:
    names = list(transformer.state_dict())  # diffusers names
    assert not layout.is_bfl_transformer(names)
    with pytest.raises(ValueError, match=r"not a FLUX transformer in BFL names: lacks img_in\.weight"):
        layout.from_bfl(transformer.state_dict())
