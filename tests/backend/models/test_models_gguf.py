"""The Q8_0 GGUF Krea-2 transformer: what is quantized, loading through diffusers' GGUF quantizer, closeness to the
float32 transformer, and the original Krea-2 tensor names."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from models_testlib import DemoBuild

from invokeai.backend.families.krea2 import layout as krea2
from invokeai.backend.models.gguf_export import linear_weight_names, write_gguf
from invokeai.backend.models.loaders import load_component
from invokeai.backend.models.probe import probe_model


def _inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    text_tokens, image_tokens = 6, 16
    positions = torch.zeros(text_tokens + image_tokens, 3)
    positions[text_tokens:, 1:] = torch.cartesian_prod(torch.arange(4.0), torch.arange(4.0))
    return {
        "hidden_states": torch.randn(1, image_tokens, 64, generator=generator),
        "encoder_hidden_states": torch.randn(1, text_tokens, 3, 32, generator=generator),
        "timestep": torch.tensor([0.7]),
        "position_ids": positions,
    }


@torch.no_grad()
def _run(model: torch.nn.Module) -> torch.Tensor:
    return model(**_inputs()).sample


@pytest.fixture(scope="module")
def fp32_transformer(demo_build: DemoBuild) -> torch.nn.Module:
    return load_component(probe_model(demo_build.krea2), "transformer")


def test_only_linear_weights_with_whole_blocks_are_quantized(
    demo_build: DemoBuild, fp32_transformer: torch.nn.Module
) -> None:
    stored = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(demo_build.gguf)).tensors}
    linear = linear_weight_names(fp32_transformer)
    state = fp32_transformer.state_dict()
    assert set(stored) == set(state)
    for name, kind in stored.items():
        whole_blocks = state[name].ndim == 2 and state[name].shape[-1] % 32 == 0
        assert kind == ("Q8_0" if name in linear and whole_blocks else "F32"), name
    assert stored["transformer_blocks.0.scale_shift_table"] == "F32"
    assert stored["text_fusion.projector.weight"] == "F32"  # a Linear, but rows of 3 fit no Q8_0 block
    assert stored["transformer_blocks.0.attn.to_k.weight"] == "Q8_0"


def test_gguf_transformer_is_close_to_float32(demo_build: DemoBuild, fp32_transformer: torch.nn.Module) -> None:
    from diffusers.quantizers.gguf.utils import GGUFLinear

    quantized = load_component(probe_model(demo_build.gguf), "transformer", dtype=torch.float32)
    assert isinstance(quantized.transformer_blocks[0].attn.to_q, GGUFLinear)
    assert quantized.transformer_blocks[0].attn.to_q.weight.quant_type == gguf.GGMLQuantizationType.Q8_0
    reference, approximate = _run(fp32_transformer), _run(quantized)
    error = (reference - approximate).abs().max().item()
    print(f"GGUF Q8_0 vs float32 transformer: max abs error {error:.3e} (output max {reference.abs().max():.2f})")
    # Q8_0 keeps ~2-3 significant digits per weight: close, but not the same numbers.
    assert 0 < error < 0.05


def _original_name(name: str) -> str:
    """diffusers name -> original Krea-2 name: krea2's table read backwards (leading segment first, so the final
    layer's table maps to last.modulation.lin rather than a block's mod.lin)."""
    for original, diffusers in krea2._ORIGINAL_LEADING:
        if name.startswith(diffusers):
            name = original + name[len(diffusers) :]
            break
    for original, diffusers in krea2._ORIGINAL_INNER:
        name = name.replace(diffusers, original)
    return "model.diffusion_model." + name


def test_original_key_layout_gguf(demo_build: DemoBuild, fp32_transformer: torch.nn.Module, tmp_path: Path) -> None:
    from diffusers.loaders.single_file_utils import convert_krea2_transformer_checkpoint_to_diffusers

    state = fp32_transformer.state_dict()
    original = {}
    for name, tensor in state.items():
        # The original checkpoint keeps each block's six modulation vectors as one flat vector.
        flat = name.startswith("transformer_blocks.") and name.endswith("scale_shift_table")
        original[_original_name(name)] = tensor.flatten() if flat else tensor
    assert "model.diffusion_model.blocks.0.attn.wq.weight" in original
    assert "model.diffusion_model.last.modulation.lin" in original
    # diffusers' own converter maps the names back: the renaming table agrees with it.
    converted = convert_krea2_transformer_checkpoint_to_diffusers(dict(original))
    assert {k: tuple(v.shape) for k, v in converted.items()} == {k: tuple(v.shape) for k, v in state.items()}
    assert {krea2.diffusers_name(name) for name in original} == set(state)

    path = tmp_path / "krea2-original.gguf"
    write_gguf(
        original, path, quantize={_original_name(n) for n in linear_weight_names(fp32_transformer)}, arch="krea2"
    )
    probe = probe_model(path)
    assert (probe.family, probe.format, probe.config_variant) == ("krea2", "gguf", "krea2-demo")
    same_weights = load_component(probe_model(demo_build.gguf), "transformer")
    assert torch.equal(_run(load_component(probe, "transformer")), _run(same_weights))


@pytest.mark.parametrize("quant_type", ["Q8_0", "BF16"])
def test_quantized_modulation_tables_are_dequantized_at_load(
    fp32_transformer: torch.nn.Module, tmp_path: Path, quant_type: str
) -> None:
    # Real converters also quantize (or store as BF16) tensors that are not Linear weights once they pass their
    # size threshold: the modulation tables here. diffusers leaves those as packed GGUF parameters, and the first
    # forward pass used to fail on their shape; they are dequantized once at load instead.
    from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter

    state = fp32_transformer.state_dict()
    path = tmp_path / f"all-{quant_type}.gguf"
    stored = write_gguf(state, path, quantize=set(state), arch="krea2", quant_type=quant_type)
    assert stored["transformer_blocks.0.scale_shift_table"] == stored["final_layer.scale_shift_table"] == quant_type
    model = load_component(probe_model(path), "transformer", dtype=torch.float32)
    packed = [
        name
        for module_name, module in model.named_modules()
        for name, parameter in module.named_parameters(prefix=module_name, recurse=False)
        if isinstance(parameter, GGUFParameter) and not isinstance(module, GGUFLinear)
    ]
    assert packed == []
    assert isinstance(model.transformer_blocks[0].attn.to_q, GGUFLinear)  # Linear weights stay quantized
    reference, approximate = _run(fp32_transformer), _run(model)
    assert (reference - approximate).abs().max().item() < 0.05
