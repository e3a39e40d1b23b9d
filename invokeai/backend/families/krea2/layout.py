"""Krea-2: components, transformer tensor names in both layouts, and the transformer's config signature.

Transformer files come with diffusers names (`transformer_blocks.0.attn.to_q.weight`) or with the original Krea-2
names (`blocks.0.attn.wq.weight`, optionally under `model.diffusion_model.`); diffusers' single-file loader converts
the latter. Probing maps the original names to diffusers' so one signature serves both. The signature pins the
hidden width (img_in), text width (txt_in), number of tapped text layers (text_fusion.projector), key/value heads and
MLP width (first block), and the block count (last block present, the next absent).
"""

from __future__ import annotations

from collections.abc import Iterable

from invokeai.backend.models.config_variants import ConfigVariant, Signature

_ORIGINAL_PREFIX = "model.diffusion_model."
# Original name -> diffusers name: whole leading segments, then pieces inside blocks.
_ORIGINAL_LEADING = (
    ("first.", "img_in."),
    ("tmlp.0.", "time_embed.linear_1."),
    ("tmlp.2.", "time_embed.linear_2."),
    ("tproj.1.", "time_mod_proj."),
    ("txtmlp.0.scale", "txt_in.norm.weight"),
    ("txtmlp.1.", "txt_in.linear_1."),
    ("txtmlp.3.", "txt_in.linear_2."),
    ("txtfusion.", "text_fusion."),
    ("blocks.", "transformer_blocks."),
    ("last.linear.", "final_layer.linear."),
    ("last.norm.scale", "final_layer.norm.weight"),
    ("last.modulation.lin", "final_layer.scale_shift_table"),
)
_ORIGINAL_INNER = (
    (".attn.wq.", ".attn.to_q."),
    (".attn.wk.", ".attn.to_k."),
    (".attn.wv.", ".attn.to_v."),
    (".attn.wo.", ".attn.to_out.0."),
    (".attn.gate.", ".attn.to_gate."),
    (".attn.qknorm.qnorm.scale", ".attn.norm_q.weight"),
    (".attn.qknorm.knorm.scale", ".attn.norm_k.weight"),
    (".mlp.", ".ff."),
    (".prenorm.scale", ".norm1.weight"),
    (".postnorm.scale", ".norm2.weight"),
    (".mod.lin", ".scale_shift_table"),
)
# Tensors every Krea-2 transformer has (diffusers names); the text-fusion projector is unique to this architecture.
_MARKERS = ("text_fusion.projector.weight", "img_in.weight", "txt_in.linear_1.weight")


def diffusers_name(name: str) -> str:
    """A transformer tensor's diffusers name, whichever layout `name` is in."""
    name = name.removeprefix(_ORIGINAL_PREFIX)
    if name.startswith(("transformer_blocks.", "img_in.", "text_fusion.", "txt_in.", "time_", "final_layer.")):
        return name
    for old, new in _ORIGINAL_LEADING:
        if name.startswith(old):
            name = new + name[len(old) :]
            break
    for old, new in _ORIGINAL_INNER:
        name = name.replace(old, new)
    return name


def is_transformer(names: Iterable[str]) -> bool:
    present = {diffusers_name(name) for name in names}
    return all(marker in present for marker in _MARKERS)


def transformer_signature(variant: ConfigVariant) -> Signature:
    config = variant.component_config("transformer")
    head_dim = config["attention_head_dim"]
    hidden = head_dim * config["num_attention_heads"]
    layers = config["num_layers"]
    return {
        "img_in.weight": (hidden, config["in_channels"]),
        "txt_in.linear_1.weight": (hidden, config["text_hidden_dim"]),
        "text_fusion.projector.weight": (1, config["num_text_layers"]),
        "transformer_blocks.0.attn.to_k.weight": (config["num_key_value_heads"] * head_dim, hidden),
        "transformer_blocks.0.ff.gate.weight": (config["intermediate_size"], hidden),
        f"transformer_blocks.{layers - 1}.attn.to_q.weight": (hidden, hidden),
        f"transformer_blocks.{layers}.attn.to_q.weight": None,
    }
