"""The causal video VAE of Wan 2.1 (diffusers' AutoencoderKLWan and AutoencoderKLQwenImage, which share its state
dict) in its original names, as single files ship it (ComfyUI's `vae/qwen_image_vae.safetensors`, Wan 2.1's VAE), and
diffusers' names.

The original layout keeps the modules of the reference implementation: `encoder.conv1`, a flat `downsamples` list
(each level's residual blocks, then its resample), `middle` (residual block, attention, residual block), `head`
(norm, activation, conv), the same for the decoder with a flat `upsamples` list (each level's residual blocks, one
more than the encoder's, then its upsample), and `conv1` / `conv2` for the quant and post-quant convolutions; a
residual block's norms and convolutions are `residual.0`, `.2`, `.3`, `.6` and its shortcut `shortcut`. diffusers
groups the decoder's list into up blocks, so mapping it needs the residual blocks per level (`num_res_blocks`);
diffusers' own converter assumes the published two, so demo-sized VAEs are mapped here, in both directions. Attention
inside the levels (`attn_scales`) is not in the published VAEs and not mapped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# Residual block pieces: original -> diffusers.
_RESNET = (
    ("residual.0.gamma", "norm1.gamma"),
    ("residual.2.", "conv1."),
    ("residual.3.gamma", "norm2.gamma"),
    ("residual.6.", "conv2."),
    ("shortcut.", "conv_shortcut."),
)
# Whole leading pieces: original -> diffusers (mid blocks and heads of both coders, the coders' first convs).
_LEADING = (
    ("encoder.conv1.", "encoder.conv_in."),
    ("decoder.conv1.", "decoder.conv_in."),
    ("encoder.head.0.", "encoder.norm_out."),
    ("encoder.head.2.", "encoder.conv_out."),
    ("decoder.head.0.", "decoder.norm_out."),
    ("decoder.head.2.", "decoder.conv_out."),
    ("encoder.middle.0.", "encoder.mid_block.resnets.0."),
    ("encoder.middle.1.", "encoder.mid_block.attentions.0."),
    ("encoder.middle.2.", "encoder.mid_block.resnets.1."),
    ("decoder.middle.0.", "decoder.mid_block.resnets.0."),
    ("decoder.middle.1.", "decoder.mid_block.attentions.0."),
    ("decoder.middle.2.", "decoder.mid_block.resnets.1."),
    ("conv1.", "quant_conv."),
    ("conv2.", "post_quant_conv."),
)
MARKERS = (
    "encoder.conv1.weight",
    "decoder.conv1.weight",
    "conv1.weight",
    "conv2.weight",
    "encoder.downsamples.0.residual.0.gamma",
    "decoder.middle.1.to_qkv.weight",
)
_UPSAMPLE = re.compile(r"^decoder\.upsamples\.(\d+)\.(.*)$")
_UP_BLOCK = re.compile(r"^decoder\.up_blocks\.(\d+)\.(resnets\.(\d+)|upsamplers\.0)\.(.*)$")


def is_original_vae(names: Iterable[str]) -> bool:
    present = set(names)
    return all(marker in present for marker in MARKERS)


def _resnet_to_diffusers(piece: str) -> str:
    for old, new in _RESNET:
        if piece.startswith(old):
            return new + piece[len(old) :]
    return piece  # a resample's or attention's piece: the same names


def _resnet_to_original(piece: str) -> str:
    for old, new in _RESNET:
        if piece.startswith(new):
            return old + piece[len(new) :]
    return piece


def diffusers_name(name: str, num_res_blocks: int) -> str:
    """One tensor's diffusers name for its original name."""
    for old, new in _LEADING:
        if name.startswith(old):
            rest = name[len(old) :]
            return new + (_resnet_to_diffusers(rest) if "resnets" in new else rest)
    if name.startswith("encoder.downsamples."):
        index, rest = name.removeprefix("encoder.downsamples.").split(".", 1)
        return f"encoder.down_blocks.{index}.{_resnet_to_diffusers(rest)}"
    match = _UPSAMPLE.match(name)
    if match:
        per_level = num_res_blocks + 2  # the residual blocks, then the upsample
        level, position = divmod(int(match.group(1)), per_level)
        rest = match.group(2)
        if position <= num_res_blocks:
            return f"decoder.up_blocks.{level}.resnets.{position}.{_resnet_to_diffusers(rest)}"
        return f"decoder.up_blocks.{level}.upsamplers.0.{rest}"
    return name


def original_name(name: str, num_res_blocks: int) -> str:
    """One tensor's original name for its diffusers name."""
    match = _UP_BLOCK.match(name)
    if match:
        level, resnet, rest = int(match.group(1)), match.group(3), match.group(4)
        per_level = num_res_blocks + 2
        if resnet is not None:
            return f"decoder.upsamples.{level * per_level + int(resnet)}.{_resnet_to_original(rest)}"
        return f"decoder.upsamples.{level * per_level + num_res_blocks + 1}.{rest}"
    if name.startswith("encoder.down_blocks."):
        index, rest = name.removeprefix("encoder.down_blocks.").split(".", 1)
        return f"encoder.downsamples.{index}.{_resnet_to_original(rest)}"
    for old, new in _LEADING:
        if name.startswith(new):
            rest = name[len(new) :]
            return old + (_resnet_to_original(rest) if "resnets" in new else rest)
    return name


def from_original(state: Mapping[str, Any], num_res_blocks: int) -> dict[str, Any]:
    return {diffusers_name(name, num_res_blocks): tensor for name, tensor in state.items()}


def to_original(state: Mapping[str, Any], num_res_blocks: int) -> dict[str, Any]:
    return {original_name(name, num_res_blocks): tensor for name, tensor in state.items()}
