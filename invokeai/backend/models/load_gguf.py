"""Load a GGUF-quantized Krea-2 transformer through diffusers' GGUF quantizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .config_variants import ConfigVariant


def load_krea2_gguf_transformer(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """Linear weights stay quantized (GGUFLinear dequantizes them to `dtype` on every call); the rest is `dtype`."""
    from diffusers import GGUFQuantizationConfig, Krea2Transformer2DModel

    model = Krea2Transformer2DModel.from_single_file(
        str(path),
        quantization_config=GGUFQuantizationConfig(compute_dtype=dtype),
        config=str(variant.path),
        subfolder="transformer",
        local_files_only=True,
        torch_dtype=dtype,
    )
    dequantize_non_linear(model, dtype)
    return model


def dequantize_non_linear(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Dequantize, once at load, every quantized (or BF16-stored) tensor that is not a GGUFLinear's weight.

    diffusers swaps only Linear layers for dequantizing ones; any other parameter stored quantized (real converters
    quantize modulation tables such as `scale_shift_table` once they pass their size threshold) would stay a
    GGUFParameter holding packed bytes, and the first forward pass would fail on its shape.
    """
    from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter, dequantize_gguf_tensor

    for module in model.modules():
        for name, parameter in list(module.named_parameters(recurse=False)):
            if isinstance(parameter, GGUFParameter) and not (isinstance(module, GGUFLinear) and name == "weight"):
                plain = dequantize_gguf_tensor(parameter).to(dtype)
                module._parameters[name] = torch.nn.Parameter(plain.as_subclass(torch.Tensor), requires_grad=False)
