"""Z-Image's Qwen3 text encoder as ComfyUI's single file (text_encoders/qwen_3_4b.safetensors): recognised by its
tensor names with or without the `model.` prefix and the language-model head, paired with the shipped config its
shapes fit (Qwen3-4B: z-image; the demo's: zimage-demo), loaded bit-equal into the Qwen3Model that encodes prompts
as demo-zimage's does; other language models and other sizes are refused with what they are."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from invokeai.backend.families.zimage import generation
from invokeai.backend.families.zimage.descriptor import CONFIG_VARIANTS, FAMILY
from invokeai.backend.models import qwen3_encoder_file
from invokeai.backend.models.errors import UnsupportedModelError
from invokeai.backend.models.loaders import components_of, load_component
from invokeai.backend.models.probe import probe_model
from invokeai.backend.models.safetensors_header import DTYPE_SIZES

VARIANTS = {variant.name: variant for variant in CONFIG_VARIANTS}


@pytest.fixture(scope="module")
def text_encoder(demo_zimage: Path) -> Any:
    from transformers import Qwen3Model

    return Qwen3Model.from_pretrained(demo_zimage, subfolder="text_encoder", dtype=torch.float32).eval()


def kind(path: Path) -> tuple[Any, ...]:
    probe = probe_model(path)
    return probe.family, probe.type, probe.format, probe.config_variant


def sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> Path:
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


def qwen3_shapes(
    config: dict[str, Any], prefix: str = qwen3_encoder_file.TEXT_ENCODER_PREFIX
) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a Qwen3Model of this config, named as ComfyUI's file names them (no weights)."""
    from transformers import Qwen3Config, Qwen3Model

    with torch.device("meta"):
        model = Qwen3Model(Qwen3Config.from_dict(config))
    return {prefix + name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize(("prefix", "lm_head"), [(True, False), (True, True), (False, False)])
def test_a_comfyui_text_encoder_file_is_the_demos_qwen3_encoder(
    text_encoder: Any, demo_zimage: Path, tmp_path: Path, prefix: bool, lm_head: bool
) -> None:
    path = tmp_path / "qwen_3_4b.safetensors"
    qwen3_encoder_file.write_comfyui_text_encoder(text_encoder, path, lm_head=lm_head)
    if not prefix:  # as Qwen3Model saves itself
        from safetensors.torch import load_file, save_file

        save_file(qwen3_encoder_file.text_encoder_state(load_file(path)), str(path))
    assert kind(path) == ("z-image", "qwen3_encoder", "checkpoint", "zimage-demo")
    probe = probe_model(path)
    assert components_of(probe) == ("text_encoder",)
    loaded = load_component(probe, "text_encoder")
    assert type(loaded).__name__ == "Qwen3Model"
    state = loaded.state_dict()
    assert sorted(state) == sorted(text_encoder.state_dict())
    for name, tensor in text_encoder.state_dict().items():
        assert torch.equal(state[name], tensor), name
    # It encodes a prompt as the pipeline's encoder does (the tokenizer is the demo pipeline's).
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_zimage, subfolder="tokenizer")
    ours = generation.encode_prompt(loaded, tokenizer, "a red fox", torch.device("cpu"))
    theirs = generation.encode_prompt(text_encoder, tokenizer, "a red fox", torch.device("cpu"))
    assert torch.equal(ours, theirs)


def test_qwen3_4b_shapes_pick_the_full_size_config(tmp_path: Path) -> None:
    config = VARIANTS["z-image"].component_config("text_encoder")
    shapes = qwen3_shapes(config)
    assert shapes["model.embed_tokens.weight"] == (151936, 2560) and "model.layers.35.mlp.up_proj.weight" in shapes
    assert kind(sparse_safetensors(tmp_path / "qwen_3_4b.safetensors", shapes)) == (
        "z-image",
        "qwen3_encoder",
        "checkpoint",
        "z-image",
    )
    # One layer fewer is no shipped config; the refusal says what the file is and what the configs take.
    fewer = {name: shape for name, shape in shapes.items() if ".layers.35." not in name}
    with pytest.raises(UnsupportedModelError, match=r"a Qwen3 text encoder of hidden size 2560 and 35 layers") as info:
        probe_model(sparse_safetensors(tmp_path / "qwen-35.safetensors", fewer))
    assert "z-image: hidden size 2560, 36 layers" in str(info.value) and "lacks layers.35." in str(info.value)


def test_other_qwen3_sizes_and_other_language_models_are_refused(tmp_path: Path) -> None:
    qwen3_8b = {
        **VARIANTS["z-image"].component_config("text_encoder"),
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
    }
    with pytest.raises(UnsupportedModelError, match="a Qwen3 text encoder of hidden size 4096 and 36 layers"):
        probe_model(sparse_safetensors(tmp_path / "qwen_3_8b.safetensors", qwen3_shapes(qwen3_8b)))
    demo = qwen3_shapes(VARIANTS["zimage-demo"].component_config("text_encoder"))
    # Qwen2 and Llama: no per-head query and key norms. Gemma 3: those, with feed-forward norms Qwen3 has not.
    qwen2 = {name: shape for name, shape in demo.items() if "_norm." not in name or "layernorm" in name}
    assert not qwen3_encoder_file.is_text_encoder(qwen2)
    with pytest.raises(UnsupportedModelError, match="in no single-file layout"):
        probe_model(sparse_safetensors(tmp_path / "qwen2.safetensors", qwen2))
    gemma = {**demo, "model.layers.0.pre_feedforward_layernorm.weight": (32,)}
    assert not qwen3_encoder_file.is_text_encoder(gemma) and qwen3_encoder_file.is_text_encoder(demo)
    with pytest.raises(UnsupportedModelError, match="in no single-file layout"):
        probe_model(sparse_safetensors(tmp_path / "gemma.safetensors", gemma))


def test_a_file_with_a_tensor_the_architecture_lacks_is_refused_at_load(text_encoder: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = tmp_path / "qwen_extra.safetensors"
    qwen3_encoder_file.write_comfyui_text_encoder(text_encoder, path)
    state = load_file(path)
    state["model.layers.0.self_attn.extra.weight"] = torch.zeros(2, 2)
    save_file(state, str(path))
    probe = probe_model(path)
    assert probe.config_variant == "zimage-demo"
    with pytest.raises(ValueError, match=r"not a Qwen3 text encoder of the zimage-demo config: .*self_attn\.extra"):
        load_component(probe, "text_encoder")


def test_the_rule_is_the_descriptors_and_names_its_components() -> None:
    (rule,) = [rule for rule in FAMILY.files if rule.type == "qwen3_encoder"]
    assert (rule.container, rule.format, rule.components) == ("safetensors", "checkpoint", ("text_encoder",))
    assert set(rule.components) <= set(FAMILY.module_components)
