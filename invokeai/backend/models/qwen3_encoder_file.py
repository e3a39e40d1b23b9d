"""The Qwen3 text encoder as ComfyUI ships it (`text_encoders/qwen_3_4b.safetensors` for Z-Image,
`qwen_3_06b_base.safetensors` for Anima): transformers' Qwen3 weights in transformers' names, under the `model.`
prefix of a Qwen3ForCausalLM checkpoint or without it (as Qwen3Model saves them), with or without the language-model
head (`lm_head.weight`, which the encoder does not use; the small Qwen3 models tie it to the token embeddings, so
their files mostly leave it out). Both are accepted. Each family passes its own config variants: the shape signature
tells the model sizes apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.models.config_variants import ConfigVariant, Signature

TEXT_ENCODER_PREFIX = "model."
LM_HEAD = "lm_head.weight"
TEXT_ENCODER_MARKERS = (
    "embed_tokens.weight",
    "norm.weight",
    "layers.0.input_layernorm.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    # The per-head query and key norms: Qwen3, not Qwen2 or Llama.
    "layers.0.self_attn.q_norm.weight",
    "layers.0.self_attn.k_norm.weight",
    "layers.0.mlp.gate_proj.weight",
)
# Gemma 3 has the query and key norms too, and feed-forward norms that Qwen3 has not.
_NOT_QWEN3 = ("layers.0.pre_feedforward_layernorm.weight",)


def text_encoder_name(name: str) -> str:
    """A text encoder tensor's name as Qwen3Model's state dict has it (without the `model.` prefix)."""
    return name.removeprefix(TEXT_ENCODER_PREFIX)


def is_text_encoder(names: Iterable[str]) -> bool:
    present = {text_encoder_name(name) for name in names}
    return all(marker in present for marker in TEXT_ENCODER_MARKERS) and not any(n in present for n in _NOT_QWEN3)


def text_encoder_signature(variant: ConfigVariant) -> Signature:
    """Shapes (Qwen3Model's names) a text encoder file made for `variant`'s text encoder config has: vocabulary and
    hidden size, the query and key-value heads, the head dim, the feed-forward width and the layer count (last
    present, next absent)."""
    c = variant.component_config("text_encoder")
    hidden, layers = c["hidden_size"], c["num_hidden_layers"]
    head_dim = c.get("head_dim") or hidden // c["num_attention_heads"]
    queries, keys = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    return {
        "embed_tokens.weight": (c["vocab_size"], hidden),
        "layers.0.self_attn.q_proj.weight": (queries, hidden),
        "layers.0.self_attn.k_proj.weight": (keys, hidden),
        "layers.0.self_attn.q_proj.bias": (queries,) if c.get("attention_bias") else None,
        "layers.0.self_attn.q_norm.weight": (head_dim,),
        "layers.0.mlp.gate_proj.weight": (c["intermediate_size"], hidden),
        f"layers.{layers - 1}.input_layernorm.weight": (hidden,),
        f"layers.{layers}.input_layernorm.weight": None,
        "norm.weight": (hidden,),
    }


def text_encoder_refusal(
    shapes: Mapping[str, tuple[int, ...]], variants: Iterable[ConfigVariant], family: str, expected: str
) -> str | None:
    """What a Qwen3 text encoder file that fits none of `variants` (`family`'s configs) is: its size, against the
    sizes they take, and `expected`, the file the family is used with."""
    embed = shapes.get("embed_tokens.weight")
    if not embed or len(embed) != 2:
        return None
    layers = sum(1 for name in shapes if name.startswith("layers.") and name.endswith(".input_layernorm.weight"))
    taken = []
    for variant in variants:
        c = variant.component_config("text_encoder")
        taken.append(f"{variant.name}: hidden size {c['hidden_size']}, {c['num_hidden_layers']} layers")
    return (
        f"a Qwen3 text encoder of hidden size {embed[1]} and {layers} layers, which no shipped {family} config "
        f"takes ({'; '.join(taken)}); {family}'s is {expected}"
    )


def text_encoder_state(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A text encoder file's tensors in Qwen3Model's names: the `model.` prefix off, the unused head left out."""
    return {text_encoder_name(name): tensor for name, tensor in state_dict.items() if name != LM_HEAD}


def write_comfyui_text_encoder(text_encoder: torch.nn.Module, path: Path, *, lm_head: bool = False) -> None:
    """A Qwen3Model as ComfyUI's text encoder file: its tensors under the `model.` prefix, and with `lm_head` the
    (tied) head a Qwen3ForCausalLM checkpoint may also hold."""
    from safetensors.torch import save_file

    state = {TEXT_ENCODER_PREFIX + name: tensor.contiguous() for name, tensor in text_encoder.state_dict().items()}
    if lm_head:
        state[LM_HEAD] = state[TEXT_ENCODER_PREFIX + "embed_tokens.weight"].clone()
    save_file(state, str(path), metadata={"format": "pt"})


def load_text_encoder(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """A Qwen3Model configured by `variant`'s text encoder config with the file's weights, on the CPU in `dtype`.
    A file that lacks a tensor of that architecture, or holds one it does not have, is refused by name."""
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config.from_dict(variant.component_config("text_encoder"))
    state = text_encoder_state(load_file(str(path)))
    model, info = Qwen3Model.from_pretrained(
        None, config=config, state_dict=state, dtype=dtype, output_loading_info=True
    )
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    if missing or unexpected or info["mismatched_keys"]:
        raise ValueError(
            f"{path.name} is not a Qwen3 text encoder of the {variant.name} config: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, mismatched {sorted(info['mismatched_keys'])[:5]}"
        )
    return model.eval()
