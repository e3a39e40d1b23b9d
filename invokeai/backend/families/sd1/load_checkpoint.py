"""Load SD-1.x components from one original-layout safetensors file, configs from a shipped variant folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from invokeai.backend.families.sd1.layout import TEXT_PREFIX
from invokeai.backend.models.config_variants import ConfigVariant
from invokeai.backend.models.load_diffusers import component_class, load_from_folder


def load_sd1_checkpoint_component(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    from diffusers import AutoencoderKL, UNet2DConditionModel

    config = str(variant.path)
    if component in ("unet", "vae"):
        cls = UNet2DConditionModel if component == "unet" else AutoencoderKL
        # `config` keeps diffusers off the hub: it reads <config>/<subfolder>/config.json instead.
        return cls.from_single_file(
            str(path), config=config, subfolder=component, local_files_only=True, torch_dtype=dtype
        )
    if component == "text_encoder":
        return _load_text_encoder(path, variant, dtype)
    # Tokenizer and scheduler are not in the file: the variant folder has them.
    return load_from_folder(variant.path, component, component_class(variant.path, component), dtype)


def _load_text_encoder(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    from diffusers.loaders.single_file_utils import create_diffusers_clip_model_from_ldm
    from transformers import CLIPTextModel

    # Only the text encoder's tensors are read (a real checkpoint is mostly UNet); diffusers' CLIP builder does the
    # prefix handling that the pipeline-level from_single_file would.
    with safe_open(str(path), framework="pt") as file:
        checkpoint = {key: file.get_tensor(key) for key in file.keys() if key.startswith(TEXT_PREFIX)}
    return create_diffusers_clip_model_from_ldm(
        CLIPTextModel,
        checkpoint=checkpoint,
        config=str(variant.path),
        subfolder="text_encoder",
        torch_dtype=dtype,
        local_files_only=True,
    )
