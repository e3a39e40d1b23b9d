"""Anima's diffusion model as ComfyUI loads it (`diffusion_models/anima-*.safetensors`): the Cosmos-Predict2 DiT in
its original (NVIDIA MiniTrainDIT) names, with the LLM adapter beside it under `llm_adapter.`, all under `net.` as
CircleStone Labs publishes it, or under ComfyUI's `model.diffusion_model.`, or bare.

One file gives two of the pipeline's components: the `transformer` (diffusers' CosmosTransformer3DModel) and the
`text_conditioner` (AnimaTextConditioner, whose names are the adapter's own). `canonical_name` drops the prefixes
and keeps the original names, which recognition and the shape signature use; `to_diffusers` maps a DiT name to
diffusers' (`to_original` is the other direction, for fixtures). The markers are tensors only Anima has together:
the Cosmos-Predict2 DiT's (cross-attention, adaLN modulation of each sub-block) and the adapter's, so a Cosmos file
without the adapter, or another family's, is not taken for one. The signature pins the DiT's width, head dim,
text width, feed-forward and adaLN-LoRA widths, input channels (with or without the padding-mask channel) and block
count (last present, next absent), and the adapter's vocabulary, widths and block count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.models.config_variants import ConfigVariant, Signature

PREFIXES = ("model.diffusion_model.", "net.")
PUBLISHED_PREFIX = "net."
ADAPTER = "llm_adapter."
MARKERS = (
    "x_embedder.proj.1.weight",
    "t_embedding_norm.weight",
    "blocks.0.adaln_modulation_cross_attn.1.weight",
    "blocks.0.cross_attn.q_proj.weight",
    "final_layer.linear.weight",
    "llm_adapter.embed.weight",
    "llm_adapter.blocks.0.cross_attn.q_proj.weight",
)
# Bookkeeping the original checkpoints carry that no module holds (training counters, the rope tables it rebuilds).
_DROPPED = re.compile(r"^(pos_embedder\.|accum_|.*_extra_state$)")
# Original -> diffusers names: whole-name pieces first, then the pieces inside a block.
_OUTER = (
    ("x_embedder.proj.1.", "patch_embed.proj."),
    ("t_embedder.1.", "time_embed.t_embedder."),
    ("t_embedding_norm.", "time_embed.norm."),
    ("final_layer.adaln_modulation.1.", "norm_out.linear_1."),
    ("final_layer.adaln_modulation.2.", "norm_out.linear_2."),
    ("final_layer.linear.", "proj_out."),
)
_INNER = (
    ("adaln_modulation_self_attn.1.", "norm1.linear_1."),
    ("adaln_modulation_self_attn.2.", "norm1.linear_2."),
    ("adaln_modulation_cross_attn.1.", "norm2.linear_1."),
    ("adaln_modulation_cross_attn.2.", "norm2.linear_2."),
    ("adaln_modulation_mlp.1.", "norm3.linear_1."),
    ("adaln_modulation_mlp.2.", "norm3.linear_2."),
    ("self_attn.q_proj.", "attn1.to_q."),
    ("self_attn.k_proj.", "attn1.to_k."),
    ("self_attn.v_proj.", "attn1.to_v."),
    ("self_attn.output_proj.", "attn1.to_out.0."),
    ("self_attn.q_norm.", "attn1.norm_q."),
    ("self_attn.k_norm.", "attn1.norm_k."),
    ("cross_attn.q_proj.", "attn2.to_q."),
    ("cross_attn.k_proj.", "attn2.to_k."),
    ("cross_attn.v_proj.", "attn2.to_v."),
    ("cross_attn.output_proj.", "attn2.to_out.0."),
    ("cross_attn.q_norm.", "attn2.norm_q."),
    ("cross_attn.k_norm.", "attn2.norm_k."),
    ("mlp.layer1.", "ff.net.0.proj."),
    ("mlp.layer2.", "ff.net.2."),
)
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.*)$")
_DIFFUSERS_BLOCK = re.compile(r"^transformer_blocks\.(\d+)\.(.*)$")


def canonical_name(name: str) -> str:
    for prefix in PREFIXES:
        name = name.removeprefix(prefix)
    return name


def is_transformer(names: Iterable[str]) -> bool:
    present = {canonical_name(name) for name in names}
    return all(marker in present for marker in MARKERS)


def _swap(name: str, pairs: tuple[tuple[str, str], ...], reverse: bool) -> str | None:
    for original, diffusers in pairs:
        old, new = (diffusers, original) if reverse else (original, diffusers)
        if name.startswith(old):
            return new + name[len(old) :]
    return None


def to_diffusers(name: str) -> str:
    """A DiT tensor's diffusers name from its original one (prefix already off)."""
    block = _BLOCK.match(name)
    if block:
        inner = _swap(block.group(2), _INNER, reverse=False)
        if inner is not None:
            return f"transformer_blocks.{block.group(1)}.{inner}"
    outer = _swap(name, _OUTER, reverse=False)
    if outer is None:
        raise ValueError(f"{name!r} is no tensor of Anima's DiT")
    return outer


def to_original(name: str) -> str:
    """A DiT tensor's original name from its diffusers one."""
    block = _DIFFUSERS_BLOCK.match(name)
    if block:
        inner = _swap(block.group(2), _INNER, reverse=True)
        if inner is not None:
            return f"blocks.{block.group(1)}.{inner}"
    outer = _swap(name, _OUTER, reverse=True)
    if outer is None:
        raise ValueError(f"{name!r} is no tensor of CosmosTransformer3DModel's that Anima's file holds")
    return outer


def split(state_dict: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the DiT's tensors in diffusers' names, the adapter's in AnimaTextConditioner's) of a file's tensors."""
    transformer, adapter = {}, {}
    for name, tensor in state_dict.items():
        name = canonical_name(name)
        if name.startswith(ADAPTER):
            adapter[name.removeprefix(ADAPTER)] = tensor
        elif not _DROPPED.match(name):
            transformer[to_diffusers(name)] = tensor
    return transformer, adapter


def transformer_signature(variant: ConfigVariant) -> Signature:
    """Shapes (original names) a diffusion model file made for `variant` has."""
    c = variant.component_config("transformer")
    a = variant.component_config("text_conditioner")
    head_dim = c["attention_head_dim"]
    width, layers = c["num_attention_heads"] * head_dim, c["num_layers"]
    patch = c.get("patch_size", (1, 2, 2))
    cells = patch[0] * patch[1] * patch[2]
    channels = c["in_channels"] + (1 if c.get("concat_padding_mask", True) else 0)
    model_dim, adapter_layers = a.get("model_dim", 1024), a.get("num_layers", 6)
    return {
        "x_embedder.proj.1.weight": (width, channels * cells),
        "blocks.0.self_attn.q_norm.weight": (head_dim,),
        "blocks.0.cross_attn.k_proj.weight": (width, c["text_embed_dim"]),
        "blocks.0.mlp.layer1.weight": (int(width * c.get("mlp_ratio", 4.0)), width),
        "blocks.0.adaln_modulation_self_attn.1.weight": (c["adaln_lora_dim"], width),
        f"blocks.{layers - 1}.self_attn.q_proj.weight": (width, width),
        f"blocks.{layers}.self_attn.q_proj.weight": None,
        "final_layer.linear.weight": (cells * c["out_channels"], width),
        "llm_adapter.embed.weight": (a.get("target_vocab_size", 32128), a.get("target_dim", 1024)),
        "llm_adapter.blocks.0.cross_attn.k_proj.weight": (model_dim, a.get("source_dim", 1024)),
        f"llm_adapter.blocks.{adapter_layers - 1}.norm_mlp.weight": (model_dim,),
        f"llm_adapter.blocks.{adapter_layers}.norm_mlp.weight": None,
        "llm_adapter.out_proj.weight": (a.get("target_dim", 1024), model_dim),
    }


def _expected_names(cls: type, config: Mapping[str, Any]) -> set[str]:
    """The state-dict names of `cls` built from `config`, built on the meta device (no memory)."""
    with torch.device("meta"):
        return set(cls.from_config(dict(config)).state_dict())


def _check(path: Path, what: str, found: Iterable[str], expected: set[str]) -> None:
    found = set(found)
    missing, unexpected = sorted(expected - found), sorted(found - expected)
    if missing or unexpected:
        raise ValueError(
            f"{path.name} is not an Anima diffusion model of this config: its {what} lacks "
            f"{missing[:5]} and has {unexpected[:5]} beyond it"
        )


def load(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    """The file's `component` (`transformer` or `text_conditioner`) configured by `variant`, on the CPU in `dtype`;
    a file that lacks a tensor of that architecture, or holds one it has not, is refused by name."""
    from diffusers import AnimaTextConditioner, CosmosTransformer3DModel
    from safetensors.torch import load_file

    transformer, adapter = split(load_file(str(path)))
    if component == "transformer":
        _check(path, "DiT", transformer, _expected_names(CosmosTransformer3DModel, variant.component_config(component)))
        return CosmosTransformer3DModel.from_single_file(
            transformer, config=str(variant.path), subfolder="transformer", local_files_only=True, torch_dtype=dtype
        )
    if component == "text_conditioner":
        config = variant.component_config(component)
        _check(path, "LLM adapter", adapter, _expected_names(AnimaTextConditioner, config))
        model = AnimaTextConditioner.from_config(dict(config))
        model.load_state_dict(adapter, strict=True)
        return model.to(dtype)
    raise ValueError(f"an Anima diffusion model file holds the transformer and text_conditioner, not {component}")


def write_safetensors(
    transformer: torch.nn.Module, text_conditioner: torch.nn.Module, path: Path, *, prefix: str = PUBLISHED_PREFIX
) -> None:
    """The DiT and adapter as Anima's diffusion model file (original names under `prefix`)."""
    from safetensors.torch import save_file

    state = {prefix + to_original(name): t.contiguous() for name, t in transformer.state_dict().items()}
    state |= {prefix + ADAPTER + name: t.contiguous() for name, t in text_conditioner.state_dict().items()}
    save_file(state, str(path), metadata={"format": "pt"})
