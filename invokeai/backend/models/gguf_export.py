"""Write a model's weights to a GGUF file, its Linear weights quantized, the way diffusers' GGUF loader reads them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import gguf
import numpy as np
import torch
from torch import nn

# Quantization types gguf's Python package can write (its K-quants are not implemented).
WRITABLE_TYPES = {
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q5_1": gguf.GGMLQuantizationType.Q5_1,
    "Q5_0": gguf.GGMLQuantizationType.Q5_0,
    "Q4_1": gguf.GGMLQuantizationType.Q4_1,
    "Q4_0": gguf.GGMLQuantizationType.Q4_0,
    "BF16": gguf.GGMLQuantizationType.BF16,
}


def linear_weight_names(model: nn.Module) -> set[str]:
    """State-dict names of the model's Linear weights: the only tensors quantized, since diffusers swaps just Linear
    layers for dequantizing ones; a quantized norm scale or modulation table would be misread."""
    return {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.Linear)}


def write_gguf(
    state_dict: Mapping[str, torch.Tensor],
    path: Path,
    *,
    quantize: Iterable[str],
    arch: str,
    quant_type: str = "Q8_0",
) -> dict[str, str]:
    """Write `state_dict` to `path`; tensors named in `quantize` whose rows split into whole quantization blocks
        become `quant_type`, all others float32; `arch` is the general.architecture the header names (converters write
    the model family's). Returns each tensor's stored type, by name."""
    qtype = WRITABLE_TYPES[quant_type]
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    wanted = set(quantize)
    writer = gguf.GGUFWriter(str(path), arch=arch)
    stored: dict[str, str] = {}
    for name in sorted(state_dict):
        array = state_dict[name].detach().to(torch.float32).cpu().numpy()
        if name in wanted and array.ndim == 2 and array.shape[-1] % block_size == 0:
            packed = gguf.quants.quantize(array, qtype)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=qtype)
            stored[name] = quant_type
        else:
            writer.add_tensor(name, np.ascontiguousarray(array), raw_dtype=gguf.GGMLQuantizationType.F32)
            stored[name] = "F32"
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored
