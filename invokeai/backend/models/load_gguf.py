"""Load a GGUF-quantized Krea-2 transformer through diffusers' GGUF quantizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .config_variants import ConfigVariant


def load_krea2_gguf_transformer(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """Linear weights stay quantized (GGUFLinear dequantizes them to `dtype` on every call); the rest is `dtype`."""
    from diffusers import GGUFQuantizationConfig, Krea2Transformer2DModel

    return Krea2Transformer2DModel.from_single_file(
        str(path),
        quantization_config=GGUFQuantizationConfig(compute_dtype=dtype),
        config=str(variant.path),
        subfolder="transformer",
        local_files_only=True,
        torch_dtype=dtype,
    )
