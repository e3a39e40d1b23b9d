"""Numbers FLUX.1's pipeline, nodes, estimators and calibration runs share (diffusers' FluxPipeline sets them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LATENT_SCALE = 8  # the FLUX AutoencoderKL: three stride-2 downsamplings
LATENT_CHANNELS = 16
PATCH = 2  # FluxPipeline packs 2x2 latent cells into one transformer token
SIZE_MULTIPLE = LATENT_SCALE * PATCH
CLIP_TOKENS = 77  # CLIP-L's full context; only its pooled output is used
T5_TOKENS_DEV = 512  # FluxPipeline's default max_sequence_length
T5_TOKENS_SCHNELL = 256  # what schnell is run with (its T5 input was trained at 256 tokens)
DEFAULT_GUIDANCE = 3.5  # FluxPipeline's guidance_scale default, the value fed to dev's guidance embedding
TIMESTEP_SCALE = 1000  # the pipeline passes t / 1000 to the transformer

# FlowMatchEulerDiscreteScheduler's defaults for the resolution-dependent shift, as FluxPipeline reads them.
SHIFT_DEFAULTS = {"base_image_seq_len": 256, "max_image_seq_len": 4096, "base_shift": 0.5, "max_shift": 1.15}


def is_guidance_distilled(transformer_config: Mapping[str, Any]) -> bool:
    """dev (and other guidance-distilled FLUX.1 models) take the guidance scale as an embedding; schnell does not."""
    return bool(transformer_config.get("guidance_embeds", False))


def default_t5_tokens(transformer_config: Mapping[str, Any]) -> int:
    """The T5 length a model is run with when the user gives none: 512 for dev, 256 for schnell."""
    return T5_TOKENS_DEV if is_guidance_distilled(transformer_config) else T5_TOKENS_SCHNELL
