"""diffusers -> original (CompVis/LDM and SGM) tensor names for the UNet2DConditionModel and the AutoencoderKL, and
writing a converted state dict as one safetensors file.

diffusers only converts the other way (original -> diffusers, in its single-file loader), so the renaming is done
here; loading the result back with diffusers' `from_single_file` is the check that it is right. The maps follow the
UNet and VAE configs (blocks, layers per block, which blocks have attention), so any UNet/VAE of this architecture
works; a family adds its own prefixes and the extra modules its UNet has (`unet_key_map(config) | {...}`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

# ResnetBlock2D: diffusers sub-module names -> the original ones, in the UNet and in the VAE.
UNET_RESNET_NAMES = (
    ("norm1.", "in_layers.0."),
    ("conv1.", "in_layers.2."),
    ("time_emb_proj.", "emb_layers.1."),
    ("norm2.", "out_layers.0."),
    ("conv2.", "out_layers.3."),
    ("conv_shortcut.", "skip_connection."),
)
VAE_RESNET_NAMES = (("conv_shortcut.", "nin_shortcut."),)
_VAE_ATTENTION = (
    ("group_norm.", "norm."),
    ("to_q.", "q."),
    ("to_k.", "k."),
    ("to_v.", "v."),
    ("to_out.0.", "proj_out."),
)


def _replace_leading(rest: str, table: tuple[tuple[str, str], ...]) -> str:
    for old, new in table:
        if rest.startswith(old):
            return new + rest[len(old) :]
    return rest


def unet_key_map(config: dict) -> dict[str, str]:
    """diffusers UNet2DConditionModel block prefix -> original prefix (resnets marked with a trailing '|')."""
    per_block = config["layers_per_block"]
    blocks = len(config["block_out_channels"])
    mapping = {
        "conv_in.": "input_blocks.0.0.",
        "time_embedding.linear_1.": "time_embed.0.",
        "time_embedding.linear_2.": "time_embed.2.",
        "conv_norm_out.": "out.0.",
        "conv_out.": "out.2.",
        "mid_block.resnets.0.": "middle_block.0.|",
        "mid_block.attentions.0.": "middle_block.1.",
        "mid_block.resnets.1.": "middle_block.2.|",
    }
    # Original input_blocks: conv_in, then per down block its layers (resnet + optional attention), then its
    # downsampler; output_blocks: per up block layers_per_block + 1 layers, the last carrying the upsampler.
    for i in range(blocks):
        for j in range(per_block):
            index = 1 + i * (per_block + 1) + j
            mapping[f"down_blocks.{i}.resnets.{j}."] = f"input_blocks.{index}.0.|"
            mapping[f"down_blocks.{i}.attentions.{j}."] = f"input_blocks.{index}.1."
        if i < blocks - 1:
            mapping[f"down_blocks.{i}.downsamplers.0.conv."] = f"input_blocks.{(i + 1) * (per_block + 1)}.0.op."
    for i, block_type in enumerate(config["up_block_types"]):
        for j in range(per_block + 1):
            index = i * (per_block + 1) + j
            mapping[f"up_blocks.{i}.resnets.{j}."] = f"output_blocks.{index}.0.|"
            mapping[f"up_blocks.{i}.attentions.{j}."] = f"output_blocks.{index}.1."
        if i < blocks - 1:
            slot = 2 if block_type.startswith("CrossAttn") else 1
            mapping[f"up_blocks.{i}.upsamplers.0.conv."] = f"output_blocks.{(i + 1) * (per_block + 1) - 1}.{slot}.conv."
    return mapping


def vae_key_map(config: dict) -> dict[str, str]:
    """diffusers AutoencoderKL block prefix -> original prefix ('|' resnet, '@' attention)."""
    blocks = len(config["block_out_channels"])
    mapping = {"encoder.conv_norm_out.": "encoder.norm_out.", "decoder.conv_norm_out.": "decoder.norm_out."}
    for part in ("encoder", "decoder"):
        mapping[f"{part}.mid_block.resnets.0."] = f"{part}.mid.block_1.|"
        mapping[f"{part}.mid_block.resnets.1."] = f"{part}.mid.block_2.|"
        mapping[f"{part}.mid_block.attentions.0."] = f"{part}.mid.attn_1.@"
    for i in range(blocks):
        for j in range(config["layers_per_block"] + 1):
            mapping[f"encoder.down_blocks.{i}.resnets.{j}."] = f"encoder.down.{i}.block.{j}.|"
            # Original decoder numbers its up blocks from the lowest resolution's end.
            mapping[f"decoder.up_blocks.{i}.resnets.{j}."] = f"decoder.up.{blocks - 1 - i}.block.{j}.|"
        mapping[f"encoder.down_blocks.{i}.downsamplers.0.conv."] = f"encoder.down.{i}.downsample.conv."
        mapping[f"decoder.up_blocks.{i}.upsamplers.0.conv."] = f"decoder.up.{blocks - 1 - i}.upsample.conv."
    return mapping


def rename_to_original(
    state: dict[str, torch.Tensor],
    mapping: dict[str, str],
    prefix: str,
    resnet_names: tuple[tuple[str, str], ...],
) -> dict[str, torch.Tensor]:
    """A component's diffusers-named state dict in original names under `prefix`, by `mapping` (from
    `unet_key_map` or `vae_key_map`), resnet sub-modules renamed by `resnet_names` (`UNET_RESNET_NAMES` or
    `VAE_RESNET_NAMES`)."""
    # Longest prefixes first, so "down_blocks.1.resnets.1." never matches a shorter entry by accident.
    ordered = sorted(mapping.items(), key=lambda item: len(item[0]), reverse=True)
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        new = key
        for old, target in ordered:
            if key.startswith(old):
                rest = key[len(old) :]
                if target.endswith("|"):
                    target, rest = target[:-1], _replace_leading(rest, resnet_names)
                elif target.endswith("@"):
                    target, rest = target[:-1], _replace_leading(rest, _VAE_ATTENTION)
                    # The original VAE attention uses 1x1 convolutions where diffusers uses Linear layers.
                    if rest.endswith(".weight") and tensor.ndim == 2:
                        tensor = tensor[:, :, None, None]
                new = target + rest
                break
        out[prefix + new] = tensor
    return out


def load_component_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a pipeline component's folder (its .safetensors files, sharded or not)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def save_checkpoint(tensors: dict[str, torch.Tensor], dest: Path) -> Path:
    """Write `tensors` as one safetensors file at `dest`; the file appears complete or not at all."""
    from safetensors.torch import save_file

    dest = Path(dest)
    partial = dest.with_name(dest.name + ".partial")
    save_file({key: value.contiguous() for key, value in tensors.items()}, str(partial), metadata={"format": "pt"})
    os.replace(partial, dest)
    return dest
