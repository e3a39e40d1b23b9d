"""Turn an SD-1.x diffusers pipeline folder into one safetensors file in the original (CompVis/LDM) key layout.

The UNet and VAE renaming is `invokeai.backend.models.original_sd_layout`'s; this adds SD-1's prefixes and its text
encoder. Loading the result back with diffusers' `from_single_file` is the check that it is right.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from invokeai.backend.families.sd1.layout import TEXT_PREFIX, UNET_PREFIX, VAE_PREFIX
from invokeai.backend.models.original_sd_layout import (
    UNET_RESNET_NAMES,
    VAE_RESNET_NAMES,
    load_component_weights,
    rename_to_original,
    save_checkpoint,
    unet_key_map,
    vae_key_map,
)


def sd1_state_dicts_to_original(
    unet: dict[str, torch.Tensor],
    vae: dict[str, torch.Tensor],
    text_encoder: dict[str, torch.Tensor],
    unet_config: dict,
    vae_config: dict,
) -> dict[str, torch.Tensor]:
    """diffusers-named component state dicts -> one original-layout state dict (sorted by name)."""
    tensors = rename_to_original(unet, unet_key_map(unet_config), UNET_PREFIX, UNET_RESNET_NAMES)
    tensors |= rename_to_original(vae, vae_key_map(vae_config), VAE_PREFIX, VAE_RESNET_NAMES)
    # transformers >= 5.6 saves CLIPTextModel without its "text_model." level; the original layout has it.
    tensors |= {TEXT_PREFIX + key.removeprefix("text_model."): value for key, value in text_encoder.items()}
    return dict(sorted(tensors.items()))


def sd1_pipeline_to_checkpoint(pipeline_dir: Path, dest: Path) -> Path:
    """Write `pipeline_dir` (an SD-1.x diffusers folder, safetensors weights) as one original-layout file at `dest`;
    the file appears complete or not at all."""
    pipeline_dir = Path(pipeline_dir)
    tensors = sd1_state_dicts_to_original(
        load_component_weights(pipeline_dir / "unet"),
        load_component_weights(pipeline_dir / "vae"),
        load_component_weights(pipeline_dir / "text_encoder"),
        json.loads((pipeline_dir / "unet" / "config.json").read_text(encoding="utf-8")),
        json.loads((pipeline_dir / "vae" / "config.json").read_text(encoding="utf-8")),
    )
    return save_checkpoint(tensors, dest)
