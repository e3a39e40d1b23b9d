"""Load a GGUF-quantized diffusers model (a transformer) through diffusers' GGUF quantizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from invokeai.backend.models.config_variants import ConfigVariant


def load_gguf_model(class_name: str, path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    """diffusers' `class_name` from the GGUF file, its config from the variant's `component` folder. Linear weights
    stay quantized (GGUFLinear dequantizes them to `dtype` on every call); the rest is `dtype`."""
    import diffusers
    from diffusers import GGUFQuantizationConfig

    model = getattr(diffusers, class_name).from_single_file(
        str(path),
        quantization_config=GGUFQuantizationConfig(compute_dtype=dtype),
        config=str(variant.path),
        subfolder=component,
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
