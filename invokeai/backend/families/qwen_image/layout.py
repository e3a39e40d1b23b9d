"""Qwen-Image's transformer as single files: ComfyUI's diffusion model (`diffusion_models/qwen_image_*.safetensors`,
bf16, or fp8 with or without ComfyUI's per-tensor scales) and the published GGUF files (Q8_0, Q4_0, Q5_1, BF16 ...).

Both use the names diffusers' QwenImageTransformer2DModel has (its original checkpoint's: diffusers loads such a file
with an identity mapping), ComfyUI's optionally under `model.diffusion_model.`. `canonical_name` drops the prefix; the
markers are tensors only this double-stream design has (the text stream's RMSNorm and input projection beside the
image's, the per-block modulation of each stream), so a Krea-2, FLUX.1 or Z-Image file is not taken for one. The
shape signature pins the width and head dim, the input channels, the text width, the feed-forward width and the
block count (last present, next absent), and refuses a guidance-embedding transformer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.models.config_variants import ConfigVariant, Signature

PREFIX = "model.diffusion_model."
MARKERS = (
    "img_in.weight",
    "txt_in.weight",
    "txt_norm.weight",
    "transformer_blocks.0.img_mod.1.weight",
    "transformer_blocks.0.txt_mod.1.weight",
    "transformer_blocks.0.attn.add_q_proj.weight",
    "time_text_embed.timestep_embedder.linear_1.weight",
)
GGUF_ARCHITECTURE = "qwen_image"  # general.architecture as the published converters write it


def canonical_name(name: str) -> str:
    return name.removeprefix(PREFIX)


def is_transformer(names: Iterable[str]) -> bool:
    present = {canonical_name(name) for name in names}
    return all(marker in present for marker in MARKERS)


def transformer_signature(variant: ConfigVariant) -> Signature:
    """Shapes (diffusers names) a transformer file made for `variant` has."""
    c = variant.component_config("transformer")
    head_dim = c["attention_head_dim"]
    width = c["num_attention_heads"] * head_dim
    layers, patch = c["num_layers"], c["patch_size"]
    return {
        "img_in.weight": (width, c["in_channels"]),
        "txt_in.weight": (width, c["joint_attention_dim"]),
        "txt_norm.weight": (c["joint_attention_dim"],),
        "transformer_blocks.0.attn.norm_q.weight": (head_dim,),
        "transformer_blocks.0.img_mlp.net.0.proj.weight": (4 * width, width),
        "proj_out.weight": (patch * patch * (c.get("out_channels") or c["in_channels"]), width),
        f"transformer_blocks.{layers - 1}.attn.to_q.weight": (width, width),
        f"transformer_blocks.{layers}.attn.to_q.weight": None,
        "time_text_embed.guidance_embedder.linear_1.weight": None,
    }


def state_in_diffusers_names(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    return {canonical_name(name): tensor for name, tensor in state_dict.items()}


def _load_into_diffusers(
    state_dict: Mapping[str, Any], variant: ConfigVariant, dtype: torch.dtype, **kwargs: Any
) -> Any:
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel.from_single_file(
        state_in_diffusers_names(state_dict),
        config=str(variant.path),
        subfolder="transformer",
        local_files_only=True,
        torch_dtype=dtype,
        **kwargs,
    )


def load_safetensors(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """A QwenImageTransformer2DModel from a safetensors file (prefix or none; fp8 weights dequantized with their
    scales), on the CPU in `dtype`."""
    from safetensors.torch import load_file

    from invokeai.backend.models.fp8_scaled import dequantized

    return _load_into_diffusers(dequantized(load_file(str(path)), dtype), variant, dtype)


def load_gguf(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """A QwenImageTransformer2DModel from a GGUF file through diffusers' GGUF quantizer: Linear weights stay
    quantized (dequantized to `dtype` on every call); anything else stored quantized is dequantized once here."""
    from diffusers import GGUFQuantizationConfig
    from diffusers.models.model_loading_utils import load_gguf_checkpoint

    from invokeai.backend.models.load_gguf import dequantize_non_linear

    model = _load_into_diffusers(
        load_gguf_checkpoint(str(path)), variant, dtype, quantization_config=GGUFQuantizationConfig(compute_dtype=dtype)
    )
    dequantize_non_linear(model, dtype)
    return model


def write_gguf(transformer: torch.nn.Module, path: Path, quant_type: str = "Q8_0") -> dict[str, str]:
    """The transformer as the published GGUF files lay it out: diffusers' names, every 2-D tensor whose rows fit the
    quantization blocks quantized (Qwen-Image's are all Linear weights), the rest F32. Returns each tensor's type."""
    from invokeai.backend.models.gguf_export import write_gguf as write

    state = transformer.state_dict()
    quantize = {name for name, tensor in state.items() if tensor.dim() == 2}
    return write(state, path, quantize=quantize, quant_type=quant_type, arch=GGUF_ARCHITECTURE)


def write_safetensors(transformer: torch.nn.Module, path: Path, *, prefix: str = "", fp8: bool = False) -> None:
    """The transformer as ComfyUI's diffusion model file (under `prefix`, e.g. PREFIX); `fp8`: its Linear weights
    stored as float8_e4m3fn with ComfyUI's per-tensor `scale_weight`, as its fp8_scaled files are."""
    from safetensors.torch import save_file

    from invokeai.backend.models.fp8_scaled import scaled_fp8

    state = {prefix + name: tensor.contiguous() for name, tensor in transformer.state_dict().items()}
    if fp8:
        state = scaled_fp8(state, {name for name, tensor in state.items() if tensor.dim() == 2})
    save_file(state, str(path))
