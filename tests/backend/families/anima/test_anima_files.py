"""Anima's single files as ComfyUI loads them: the diffusion model (the Cosmos DiT in its original names with the
LLM adapter under llm_adapter., published under net., ComfyUI's model.diffusion_model. or bare) probes as an Anima
`transformer` giving both components, which load equal to the demo's; the Qwen3-0.6B text encoder file probes as
Anima's (a Qwen3-4B one as Z-Image's); full-size headers pick the full-size configs; a Cosmos DiT without the adapter
and a file missing a tensor are refused saying what was expected."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from invokeai.backend.families import config_variant
from invokeai.backend.families.anima import layout
from invokeai.backend.models import qwen3_encoder_file
from invokeai.backend.models.errors import UnsupportedModelError
from invokeai.backend.models.loaders import components_of, load_component
from invokeai.backend.models.probe import probe_model


def kind(path: Path) -> tuple[Any, ...]:
    probe = probe_model(path)
    return probe.family, probe.type, probe.format, probe.config_variant


def sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]]) -> Path:
    """A safetensors file with these tensors' header and a hole for their data (bf16): a real-size file's layout,
    as the probe reads it, at no disk cost."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        file.truncate(8 + len(raw) + offset)
    return path


def full_size_shapes(prefix: str = layout.PUBLISHED_PREFIX) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of Anima's published diffusion model (the shipped `anima` config), original names."""
    from diffusers import AnimaTextConditioner, CosmosTransformer3DModel

    variant = config_variant("anima")
    with torch.device("meta"):
        dit = CosmosTransformer3DModel.from_config(variant.component_config("transformer"))
        adapter = AnimaTextConditioner.from_config(variant.component_config("text_conditioner"))
    shapes = {prefix + layout.to_original(name): tuple(t.shape) for name, t in dit.state_dict().items()}
    shapes |= {prefix + layout.ADAPTER + name: tuple(t.shape) for name, t in adapter.state_dict().items()}
    return shapes


def test_names_map_both_ways(anima_pipe: Any) -> None:
    for name in anima_pipe.transformer.state_dict():
        assert layout.to_diffusers(layout.to_original(name)) == name
    assert layout.to_diffusers("blocks.3.cross_attn.output_proj.weight") == "transformer_blocks.3.attn2.to_out.0.weight"
    assert layout.to_diffusers("x_embedder.proj.1.weight") == "patch_embed.proj.weight"
    with pytest.raises(ValueError, match="no tensor of Anima's DiT"):
        layout.to_diffusers("double_blocks.0.img_attn.qkv.weight")


@pytest.mark.parametrize("prefix", ["net.", "model.diffusion_model.", ""])
def test_a_comfyui_diffusion_model_file_is_the_demos_dit_and_adapter(
    anima_pipe: Any, tmp_path: Path, prefix: str
) -> None:
    path = tmp_path / "anima-demo.safetensors"
    layout.write_safetensors(anima_pipe.transformer, anima_pipe.text_conditioner, path, prefix=prefix)
    assert kind(path) == ("anima", "transformer", "checkpoint", "anima-demo")
    probe = probe_model(path)
    assert components_of(probe) == ("transformer", "text_conditioner")
    for component in ("transformer", "text_conditioner"):
        loaded = load_component(probe, component).state_dict()
        expected = getattr(anima_pipe, component).state_dict()
        assert sorted(loaded) == sorted(expected)
        assert all(torch.equal(loaded[name], tensor) for name, tensor in expected.items()), component


def test_the_qwen3_06b_file_is_animas_and_the_4b_file_z_images(anima_pipe: Any, tmp_path: Path) -> None:
    path = tmp_path / "qwen_3_06b_demo.safetensors"
    qwen3_encoder_file.write_comfyui_text_encoder(anima_pipe.text_encoder, path)
    assert kind(path) == ("anima", "qwen3_encoder", "checkpoint", "anima-demo")
    loaded = load_component(probe_model(path), "text_encoder").state_dict()
    assert all(torch.equal(loaded[name], t) for name, t in anima_pipe.text_encoder.state_dict().items())
    for name, family in (("anima", "anima"), ("z-image", "z-image")):
        from transformers import Qwen3Config, Qwen3Model

        with torch.device("meta"):
            model = Qwen3Model(Qwen3Config.from_dict(config_variant(name).component_config("text_encoder")))
        shapes = {"model." + n: tuple(t.shape) for n, t in model.state_dict().items()}
        assert kind(sparse_safetensors(tmp_path / f"{name}-qwen3.safetensors", shapes)) == (
            family,
            "qwen3_encoder",
            "checkpoint",
            name,
        )


def test_the_full_size_diffusion_model_picks_the_anima_config(tmp_path: Path) -> None:
    shapes = full_size_shapes()
    assert shapes["net.x_embedder.proj.1.weight"] == (2048, 68) and "net.blocks.27.mlp.layer1.weight" in shapes
    assert kind(sparse_safetensors(tmp_path / "anima-base.safetensors", shapes)) == (
        "anima",
        "transformer",
        "checkpoint",
        "anima",
    )


def test_a_cosmos_dit_without_the_adapter_is_refused(tmp_path: Path) -> None:
    shapes = {name: shape for name, shape in full_size_shapes().items() if ".llm_adapter." not in f".{name}"}
    with pytest.raises(UnsupportedModelError, match="a Cosmos-Predict2 DiT without Anima's LLM adapter"):
        probe_model(sparse_safetensors(tmp_path / "cosmos-predict2.safetensors", shapes))


def test_a_file_missing_a_tensor_is_refused_at_load_naming_it(anima_pipe: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = tmp_path / "anima-broken.safetensors"
    layout.write_safetensors(anima_pipe.transformer, anima_pipe.text_conditioner, path)
    state = load_file(path)
    del state["net.blocks.0.cross_attn.v_proj.weight"]
    save_file(state, str(path))
    probe = probe_model(path)
    with pytest.raises(ValueError, match=r"lacks \['transformer_blocks.0.attn2.to_v.weight'\]"):
        load_component(probe, "transformer")
