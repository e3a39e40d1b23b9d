"""Qwen-Image's other two ComfyUI split files: the Qwen2.5-VL text encoder (`text_encoders/qwen_2.5_vl_7b*.safetensors`)
and the VAE (`vae/qwen_image_vae.safetensors`). The transformer's files are `layout`'s."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.models.config_variants import ConfigVariant, Signature

# --- The Qwen2.5-VL text encoder as ComfyUI ships it (text_encoders/qwen_2.5_vl_7b*.safetensors) -------------------
# transformers' Qwen2.5-VL checkpoint names from before its 4.52 layout: the language model under `model.`, the
# vision tower under `visual.`, the head `lm_head` (often left out: the encoder never reads it); bf16, or fp8 with
# ComfyUI's scales. Files in today's names (`model.language_model.`, `model.visual.`) are taken too. Recognition and
# signatures use today's names.
_TEXT_RENAMES = (("model.language_model.", None), ("model.visual.", None), ("model.", "model.language_model."))
LM_HEAD = "lm_head.weight"
TEXT_ENCODER_MARKERS = (
    "model.language_model.embed_tokens.weight",
    "model.language_model.norm.weight",
    # Qwen2's q, k, v biases (Qwen3 has per-head norms instead), and the vision tower Qwen2.5-VL adds.
    "model.language_model.layers.0.self_attn.q_proj.bias",
    "model.language_model.layers.0.mlp.gate_proj.weight",
    "model.visual.patch_embed.proj.weight",
    "model.visual.merger.ln_q.weight",
)


def text_encoder_name(name: str) -> str:
    """A text encoder tensor's name in today's Qwen2_5_VLForConditionalGeneration state dict."""
    if name.startswith("visual."):
        return "model." + name
    for prefix, replacement in _TEXT_RENAMES:
        if name.startswith(prefix):
            return name if replacement is None else replacement + name[len(prefix) :]
    return name


def is_text_encoder(names: Iterable[str]) -> bool:
    present = {text_encoder_name(name) for name in names}
    return all(marker in present for marker in TEXT_ENCODER_MARKERS)


def _text_encoder_shapes(variant: ConfigVariant) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape of the variant's text encoder (built on the meta device: no memory, no weights)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig.from_dict(variant.component_config("text_encoder"))
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(config)
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def text_encoder_signature(variant: ConfigVariant) -> Signature:
    """Shapes a text encoder file for `variant` has: vocabulary and width, query and key-value heads, the MLP, the
    layer count (last present, next absent), and the vision tower's patch embedding, depth and output width."""
    shapes = _text_encoder_shapes(variant)
    layers = 1 + max(int(name.split(".")[3]) for name in shapes if name.startswith("model.language_model.layers."))
    blocks = 1 + max(int(name.split(".")[3]) for name in shapes if name.startswith("model.visual.blocks."))
    kept = (
        "model.language_model.embed_tokens.weight",
        "model.language_model.layers.0.self_attn.q_proj.weight",
        "model.language_model.layers.0.self_attn.k_proj.weight",
        "model.language_model.layers.0.mlp.gate_proj.weight",
        f"model.language_model.layers.{layers - 1}.input_layernorm.weight",
        "model.visual.patch_embed.proj.weight",
        f"model.visual.blocks.{blocks - 1}.norm1.weight",
        "model.visual.merger.mlp.2.weight",
    )
    return {
        **{name: shapes[name] for name in kept},
        f"model.language_model.layers.{layers}.input_layernorm.weight": None,
        f"model.visual.blocks.{blocks}.norm1.weight": None,
    }


def text_encoder_refusal(shapes: Mapping[str, tuple[int, ...]], variants: Iterable[ConfigVariant]) -> str | None:
    """What a Qwen2.5-VL text encoder file that fits none of `variants` is: its size, against the sizes they take."""
    embed = shapes.get("model.language_model.embed_tokens.weight")
    if not embed or len(embed) != 2:
        return None
    layers = sum(1 for name in shapes if name.endswith(".input_layernorm.weight"))
    taken = [
        f"{v.name}: hidden size {c['hidden_size']}, {c['num_hidden_layers']} layers"
        for v in variants
        for c in [v.component_config("text_encoder").get("text_config", {})]
    ]
    return (
        f"a Qwen2.5-VL text encoder of hidden size {embed[1]} and {layers} layers, which no shipped Qwen-Image config "
        f"takes ({'; '.join(taken)}); Qwen-Image's is Qwen2.5-VL-7B (ComfyUI's qwen_2.5_vl_7b.safetensors)"
    )


def load_text_encoder(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """A Qwen2_5_VLForConditionalGeneration configured by `variant` with the file's weights (fp8 dequantized), on the
    CPU in `dtype`. A file without the head gets the token embeddings there (the encoder never reads the head, so no
    weights are made up for it); a file that lacks a tensor of the architecture, or has one it does not, is refused
    by name."""
    from safetensors.torch import load_file
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from invokeai.backend.models.fp8_scaled import dequantized

    state = {text_encoder_name(name): tensor for name, tensor in dequantized(load_file(str(path)), dtype).items()}
    state.setdefault(LM_HEAD, state["model.language_model.embed_tokens.weight"])
    config = Qwen2_5_VLConfig.from_dict(variant.component_config("text_encoder"))
    model, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        None, config=config, state_dict=state, dtype=dtype, output_loading_info=True
    )
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    if missing or unexpected or info["mismatched_keys"]:
        raise ValueError(
            f"{path.name} is not a Qwen2.5-VL text encoder of the {variant.name} config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, mismatched {sorted(info['mismatched_keys'])[:5]}"
        )
    return model.eval()


def write_comfyui_text_encoder(
    text_encoder: torch.nn.Module, path: Path, *, lm_head: bool = False, fp8: bool = False
) -> None:
    """A Qwen2_5_VLForConditionalGeneration as ComfyUI's text encoder file: the language model under `model.`, the
    vision tower under `visual.`, the head only with `lm_head`; `fp8`: its 2-D weights as ComfyUI's scaled fp8."""
    from safetensors.torch import save_file

    from invokeai.backend.models.fp8_scaled import scaled_fp8

    state = {}
    for name, tensor in text_encoder.state_dict().items():
        if name == LM_HEAD and not lm_head:
            continue
        name = name.replace("model.language_model.", "model.", 1).replace("model.visual.", "visual.", 1)
        state[name] = tensor.contiguous()
    if fp8:
        state = scaled_fp8(state, {name for name, tensor in state.items() if tensor.dim() == 2})
    save_file(state, str(path), metadata={"format": "pt"})


# --- The VAE as ComfyUI ships it (vae/qwen_image_vae.safetensors): Wan 2.1's original names --------------------


def is_vae(names: Iterable[str]) -> bool:
    from invokeai.backend.models.wan_vae_layout import is_original_vae

    return is_original_vae(names)


def _vae_shapes(variant: ConfigVariant) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape of the variant's VAE, in the original names (built on the meta device)."""
    from diffusers import AutoencoderKLQwenImage

    from invokeai.backend.models.wan_vae_layout import to_original

    config = variant.component_config("vae")
    with torch.device("meta"):
        model = AutoencoderKLQwenImage.from_config(config)
    state = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    return to_original(state, config["num_res_blocks"])


def vae_signature(variant: ConfigVariant) -> Signature:
    """Every tensor a VAE file for `variant` has, with its shape (the whole architecture: levels, widths, residual
    blocks per level), and the next upsample absent."""
    shapes = _vae_shapes(variant)
    last = max(int(name.split(".")[2]) for name in shapes if name.startswith("decoder.upsamples."))
    return {**shapes, f"decoder.upsamples.{last + 1}.residual.0.gamma": None}


def vae_refusal(shapes: Mapping[str, tuple[int, ...]], variants: Iterable[ConfigVariant]) -> str | None:
    channels = shapes.get("conv2.weight")  # the post-quant conv: latent channels in and out
    if not channels:
        return None
    return (
        f"a Wan-style causal VAE of {channels[0]} latent channels and this layout, which no shipped Qwen-Image config "
        "takes; Qwen-Image's VAE has 16 (ComfyUI's qwen_image_vae.safetensors, Wan 2.1's VAE)"
    )


def load_vae(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """An AutoencoderKLQwenImage configured by `variant` with the file's weights, on the CPU in `dtype`."""
    from diffusers import AutoencoderKLQwenImage
    from safetensors.torch import load_file

    from invokeai.backend.models.fp8_scaled import dequantized
    from invokeai.backend.models.wan_vae_layout import from_original

    config = variant.component_config("vae")
    state = from_original(dequantized(load_file(str(path)), dtype), config["num_res_blocks"])
    with torch.device("meta"):
        model = AutoencoderKLQwenImage.from_config(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(dtype=dtype).eval()


def write_comfyui_vae(vae: torch.nn.Module, path: Path) -> None:
    """An AutoencoderKLQwenImage as ComfyUI's VAE file: Wan 2.1's original names."""
    from safetensors.torch import save_file

    from invokeai.backend.models.wan_vae_layout import to_original

    state = {name: tensor.contiguous() for name, tensor in vae.state_dict().items()}
    save_file(to_original(state, vae.config.num_res_blocks), str(path))
