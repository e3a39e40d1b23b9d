"""Turn an SD-1.x diffusers pipeline folder into one safetensors file in the original (CompVis/LDM) key layout.

diffusers only converts the other way (original -> diffusers, in its single-file loader), so the renaming is done
here; loading the result back with diffusers' `from_single_file` is the check that it is right. The map follows the
UNet and VAE configs (blocks, layers per block, which blocks have attention), so any SD-1.x-shaped pipeline works.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from invokeai.backend.families.sd1.layout import TEXT_PREFIX, UNET_PREFIX, VAE_PREFIX

_UNET_RESNET = (
    ("norm1.", "in_layers.0."),
    ("conv1.", "in_layers.2."),
    ("time_emb_proj.", "emb_layers.1."),
    ("norm2.", "out_layers.0."),
    ("conv2.", "out_layers.3."),
    ("conv_shortcut.", "skip_connection."),
)
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


_VAE_RESNET = (("conv_shortcut.", "nin_shortcut."),)


def _rename(
    state: dict[str, torch.Tensor],
    mapping: dict[str, str],
    prefix: str,
    resnet_names: tuple[tuple[str, str], ...],
) -> dict[str, torch.Tensor]:
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


def _load_component(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def sd1_state_dicts_to_original(
    unet: dict[str, torch.Tensor],
    vae: dict[str, torch.Tensor],
    text_encoder: dict[str, torch.Tensor],
    unet_config: dict,
    vae_config: dict,
) -> dict[str, torch.Tensor]:
    """diffusers-named component state dicts -> one original-layout state dict (sorted by name)."""
    tensors = _rename(unet, unet_key_map(unet_config), UNET_PREFIX, _UNET_RESNET)
    tensors |= _rename(vae, vae_key_map(vae_config), VAE_PREFIX, _VAE_RESNET)
    # transformers >= 5.6 saves CLIPTextModel without its "text_model." level; the original layout has it.
    tensors |= {TEXT_PREFIX + key.removeprefix("text_model."): value for key, value in text_encoder.items()}
    return dict(sorted(tensors.items()))


def sd1_pipeline_to_checkpoint(pipeline_dir: Path, dest: Path) -> Path:
    """Write `pipeline_dir` (an SD-1.x diffusers folder, safetensors weights) as one original-layout file at `dest`;
    the file appears complete or not at all."""
    pipeline_dir, dest = Path(pipeline_dir), Path(dest)
    tensors = sd1_state_dicts_to_original(
        _load_component(pipeline_dir / "unet"),
        _load_component(pipeline_dir / "vae"),
        _load_component(pipeline_dir / "text_encoder"),
        json.loads((pipeline_dir / "unet" / "config.json").read_text(encoding="utf-8")),
        json.loads((pipeline_dir / "vae" / "config.json").read_text(encoding="utf-8")),
    )
    partial = dest.with_name(dest.name + ".partial")
    save_file({key: value.contiguous() for key, value in tensors.items()}, str(partial), metadata={"format": "pt"})
    os.replace(partial, dest)
    return dest
