"""Load SDXL components from one SGM-layout safetensors file, configs from a shipped variant folder.

The UNet and VAE go through diffusers' per-class `from_single_file`; each text encoder through diffusers' CLIP /
OpenCLIP builder, given only its own prefix's tensors: diffusers tells the two apart by which keys are present and
by their widths, and a checkpoint whose two encoders have the same width (the demo's) would otherwise convert the
OpenCLIP one with the CLIP names. Tokenizers and the scheduler are not in the file: the variant folder has them.
A file of fp16 tensors (the ones people download) loads in whatever `dtype` is asked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from invokeai.backend.models.config_variants import ConfigVariant
from invokeai.backend.models.load_diffusers import component_class, load_from_folder

from .layout import TEXT_2_PREFIX, TEXT_PREFIX

_TEXT_ENCODERS = {"text_encoder": TEXT_PREFIX, "text_encoder_2": TEXT_2_PREFIX}


def load_checkpoint_component(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    from diffusers import AutoencoderKL, UNet2DConditionModel

    if component in ("unet", "vae"):
        cls = UNet2DConditionModel if component == "unet" else AutoencoderKL
        # `config` keeps diffusers off the hub: it reads <config>/<subfolder>/config.json instead.
        return cls.from_single_file(
            str(path), config=str(variant.path), subfolder=component, local_files_only=True, torch_dtype=dtype
        )
    if component in _TEXT_ENCODERS:
        return _load_text_encoder(path, variant, component, dtype)
    return load_from_folder(variant.path, component, component_class(variant.path, component), dtype)


def _load_text_encoder(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    from diffusers.loaders.single_file_utils import create_diffusers_clip_model_from_ldm

    prefix = _TEXT_ENCODERS[component]
    with safe_open(str(path), framework="pt") as file:
        checkpoint = {key: file.get_tensor(key) for key in file.keys() if key.startswith(prefix)}
    if not checkpoint:
        raise ValueError(f"{path.name} has no {component} tensors ({prefix}*)")
    return create_diffusers_clip_model_from_ldm(
        component_class(variant.path, component),
        checkpoint=checkpoint,
        config=str(variant.path),
        subfolder=component,
        torch_dtype=dtype,
        local_files_only=True,
    )
