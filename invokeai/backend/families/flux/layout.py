"""FLUX.1 transformer files in the original Black Forest Labs names, as people download them.

The BFL layout (`double_blocks.*`, `single_blocks.*`, `img_in`, `txt_in`, `time_in`, `vector_in`, `guidance_in`,
`final_layer`, optionally under `model.diffusion_model.`) fuses what diffusers keeps apart: a double block's q, k and
v per stream (`img_attn.qkv`, `txt_attn.qkv`), and a single block's q, k, v and MLP input (`linear1`); and its final
modulation is ordered (shift, scale) where diffusers' AdaLayerNormContinuous takes (scale, shift).

diffusers converts BFL names itself, but its converter assumes FLUX.1's width (3072, MLP ratio 4) when it splits
`linear1`, so any other width (the demo, test fixtures) would be split wrong; `from_bfl` here splits by the tensors'
own rows and is used for every file. `to_bfl` is the other direction (diffusers has none), for fixtures and the
GGUF demo. Both work on GGUF parameters too: quantized rows stay whole under row splits and concatenations.

A GGUF transformer is laid out as the common converters write it: BFL names, Linear weights quantized (Q8_0 and
the like), 1-D tensors F32. Every 2-D FLUX tensor is a Linear weight, but files from other converters may quantize
other tensors, so everything not a GGUFLinear weight is dequantized at load.
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
    "time_in.in_layer.weight",
    "vector_in.in_layer.weight",
    "double_blocks.0.img_attn.qkv.weight",
    "single_blocks.0.linear1.weight",
    "final_layer.linear.weight",
)
GUIDANCE_TIMESTEP_CHANNELS = 256  # the timestep-style projection guidance_in embeds

# diffusers name -> BFL name for tensors that map one to one (weights and biases both, unless marked).
_EMBEDDERS = {
    "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
    "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
    "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
    "context_embedder": "txt_in",
    "x_embedder": "img_in",
    "proj_out": "final_layer.linear",
}
_DOUBLE = {
    "norm1.linear": "img_mod.lin",
    "norm1_context.linear": "txt_mod.lin",
    "ff.net.0.proj": "img_mlp.0",
    "ff.net.2": "img_mlp.2",
    "ff_context.net.0.proj": "txt_mlp.0",
    "ff_context.net.2": "txt_mlp.2",
    "attn.to_out.0": "img_attn.proj",
    "attn.to_add_out": "txt_attn.proj",
}
_DOUBLE_NORMS = {
    "attn.norm_q.weight": "img_attn.norm.query_norm.scale",
    "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
    "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
    "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
}
_DOUBLE_FUSED = {
    "img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
}
_SINGLE = {"norm.linear": "modulation.lin", "proj_out": "linear2"}
_SINGLE_NORMS = {"attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale"}
_SINGLE_FUSED = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
_FINAL_MODULATION = ("norm_out.linear", "final_layer.adaLN_modulation.1")


def canonical_name(name: str) -> str:
    """A BFL tensor name without the checkpoint prefix some files carry."""
    return name.removeprefix(PREFIX)


def is_bfl_transformer(names: Iterable[str]) -> bool:
    present = {canonical_name(name) for name in names}
    return all(marker in present for marker in MARKERS)


def _block_count(names: Iterable[str], kind: str) -> int:
    indices = {int(name.split(".")[1]) for name in names if name.startswith(f"{kind}.")}
    return max(indices) + 1 if indices else 0


def _swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    """(a, b) -> (b, a) along the rows: shift/scale <-> scale/shift; its own inverse."""
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def to_bfl(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers FluxTransformer2DModel state dict in BFL names (without the checkpoint prefix)."""
    sd = dict(state_dict)
    out: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        return sd.pop(name)

    for old, new in _EMBEDDERS.items():
        for suffix in (".weight", ".bias"):
            if old + suffix in sd:
                out[new + suffix] = take(old + suffix)
    for suffix in (".weight", ".bias"):
        out[_FINAL_MODULATION[1] + suffix] = _swap_halves(take(_FINAL_MODULATION[0] + suffix))
    for i in range(_block_count(sd, "transformer_blocks")):
        src, dst = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for suffix in (".weight", ".bias"):
            for old, new in _DOUBLE.items():
                out[dst + new + suffix] = take(src + old + suffix)
            for fused, parts in _DOUBLE_FUSED.items():
                out[dst + fused + suffix] = torch.cat([take(src + part + suffix) for part in parts], dim=0)
        for old, new in _DOUBLE_NORMS.items():
            out[dst + new] = take(src + old)
    for i in range(_block_count(sd, "single_transformer_blocks")):
        src, dst = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for suffix in (".weight", ".bias"):
            for old, new in _SINGLE.items():
                out[dst + new + suffix] = take(src + old + suffix)
            out[dst + "linear1" + suffix] = torch.cat([take(src + part + suffix) for part in _SINGLE_FUSED], dim=0)
        for old, new in _SINGLE_NORMS.items():
            out[dst + new] = take(src + old)
    if sd:
        raise ValueError(f"tensors with no BFL name: {sorted(sd)[:5]}")
    return out


def from_bfl(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A BFL-named transformer state dict (with or without the prefix) in diffusers names; fused tensors are split
    by rows, so this works at any width and on quantized GGUF parameters."""
    sd = {canonical_name(name): tensor for name, tensor in state_dict.items()}
    missing = [marker for marker in MARKERS if marker not in sd]
    if missing:
        raise ValueError(f"not a FLUX transformer in BFL names: lacks {', '.join(missing)}")
    hidden = sd["img_in.weight"].shape[0]  # rows: the same for packed quantized tensors
    out: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        return sd.pop(name)

    for new, old in _EMBEDDERS.items():
        for suffix in (".weight", ".bias"):
            if old + suffix in sd:
                out[new + suffix] = take(old + suffix)
    for suffix in (".weight", ".bias"):
        out[_FINAL_MODULATION[0] + suffix] = _swap_halves(take(_FINAL_MODULATION[1] + suffix))
    for i in range(_block_count(sd, "double_blocks")):
        src, dst = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        for suffix in (".weight", ".bias"):
            for new, old in _DOUBLE.items():
                out[dst + new + suffix] = take(src + old + suffix)
            for fused, parts in _DOUBLE_FUSED.items():
                for part, piece in zip(parts, take(src + fused + suffix).chunk(3, dim=0), strict=True):
                    out[dst + part + suffix] = piece
        for new, old in _DOUBLE_NORMS.items():
            out[dst + new] = take(src + old)
    for i in range(_block_count(sd, "single_blocks")):
        src, dst = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        for suffix in (".weight", ".bias"):
            for new, old in _SINGLE.items():
                out[dst + new + suffix] = take(src + old + suffix)
            fused = take(src + "linear1" + suffix)
            sizes = (hidden, hidden, hidden, fused.shape[0] - 3 * hidden)
            for part, piece in zip(_SINGLE_FUSED, fused.split(sizes, dim=0), strict=True):
                out[dst + part + suffix] = piece
        for new, old in _SINGLE_NORMS.items():
            out[dst + new] = take(src + old)
    if sd:
        raise ValueError(f"tensors this FLUX converter does not know: {sorted(sd)[:5]}")
    return out


def transformer_signature(variant: ConfigVariant) -> Signature:
    """Shapes (BFL names) a transformer file made for `variant` has: widths, the head dim (from the q-norm scale),
    the block counts (last present, next absent) and whether it embeds guidance (dev) or not (schnell)."""
    c = variant.component_config("transformer")
    head_dim = c["attention_head_dim"]
    hidden = head_dim * c["num_attention_heads"]
    doubles, singles = c["num_layers"], c["num_single_layers"]
    mlp = int(hidden * c.get("mlp_ratio", 4.0))
    guidance = (hidden, GUIDANCE_TIMESTEP_CHANNELS) if c.get("guidance_embeds") else None
    return {
        "img_in.weight": (hidden, c["in_channels"]),
        "txt_in.weight": (hidden, c["joint_attention_dim"]),
        "vector_in.in_layer.weight": (hidden, c["pooled_projection_dim"]),
        "guidance_in.in_layer.weight": guidance,
        "double_blocks.0.img_attn.norm.query_norm.scale": (head_dim,),
        f"double_blocks.{doubles - 1}.img_attn.qkv.weight": (3 * hidden, hidden),
        f"double_blocks.{doubles}.img_attn.qkv.weight": None,
        f"single_blocks.{singles - 1}.linear1.weight": (3 * hidden + mlp, hidden),
        f"single_blocks.{singles}.linear1.weight": None,
    }


def write_bfl_safetensors(transformer: torch.nn.Module, path: Path, *, prefix: str = "") -> None:
    """The transformer as one safetensors file in BFL names (under `prefix`, e.g. PREFIX, if given)."""
    from safetensors.torch import save_file

    bfl = to_bfl(transformer.state_dict())
    save_file({prefix + name: tensor.contiguous() for name, tensor in bfl.items()}, str(path))


def write_bfl_gguf(transformer: torch.nn.Module, path: Path, quant_type: str = "Q8_0") -> dict[str, str]:
    """The transformer as a GGUF file the way the common converters lay it out: BFL names, every Linear weight
    (every 2-D tensor in FLUX) quantized, the rest F32. Returns each tensor's stored type."""
    from invokeai.backend.models.gguf_export import write_gguf

    bfl = to_bfl(transformer.state_dict())
    linear = {name for name, tensor in bfl.items() if tensor.dim() == 2}
    return write_gguf(bfl, path, quantize=linear, quant_type=quant_type, arch="flux")


def _load_into_diffusers(state_dict: dict[str, Any], variant: ConfigVariant, dtype: torch.dtype, **kwargs: Any) -> Any:
    from diffusers import FluxTransformer2DModel

    # Passed as a dict of diffusers names: diffusers then skips its own (width-bound) conversion.
    return FluxTransformer2DModel.from_single_file(
        from_bfl(state_dict),
        config=str(variant.path),
        subfolder="transformer",
        local_files_only=True,
        torch_dtype=dtype,
        **kwargs,
    )


def load_bfl_safetensors(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """A FluxTransformer2DModel from a BFL-named safetensors file, on the CPU in `dtype`."""
    from safetensors.torch import load_file

    return _load_into_diffusers(load_file(str(path)), variant, dtype)


def load_bfl_gguf(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """A FluxTransformer2DModel from a BFL-named GGUF file through diffusers' GGUF quantizer: Linear weights stay
    quantized (dequantized to `dtype` on every call), everything else is dequantized once here."""
    from diffusers import GGUFQuantizationConfig
    from diffusers.models.model_loading_utils import load_gguf_checkpoint

    from invokeai.backend.models.load_gguf import dequantize_non_linear

    model = _load_into_diffusers(
        load_gguf_checkpoint(str(path)),
        variant,
        dtype,
        quantization_config=GGUFQuantizationConfig(compute_dtype=dtype),
    )
    dequantize_non_linear(model, dtype)
    return model


# The FLUX.1 VAE as Black Forest Labs ship it (`ae.safetensors`, which Z-Image's downloads reuse): an AutoencoderKL
# of 16 latent channels in the original (LDM) names, without quant_conv / post_quant_conv. The names alone are any
# LDM VAE's (SD-1's and SDXL's too, with 4 latent channels); the shapes tell them apart.
VAE_MARKERS = (
    "encoder.conv_in.weight",
    "encoder.down.0.block.0.conv1.weight",
    "encoder.mid.attn_1.q.weight",
    "encoder.conv_out.weight",
    "decoder.conv_in.weight",
    "decoder.mid.block_1.conv1.weight",
    "decoder.up.0.block.0.conv1.weight",
    "decoder.conv_out.weight",
)


def is_original_vae(names: Iterable[str]) -> bool:
    present = set(names)
    return all(marker in present for marker in VAE_MARKERS)


def vae_signature(variant: ConfigVariant) -> Signature:
    """Shapes (original names) a VAE file made for `variant`'s VAE config has: the latent channels (the encoder's
    mean and log-variance, the decoder's input), the widths at both ends, the block and layer counts (last present,
    next absent; the decoder's up blocks have one resnet more) and whether it has the quant convs."""
    c = variant.component_config("vae")
    widths, layers, latent = c["block_out_channels"], c["layers_per_block"], c["latent_channels"]
    blocks = len(widths)
    return {
        "encoder.conv_out.weight": (2 * latent, widths[-1], 3, 3),
        "decoder.conv_in.weight": (widths[-1], latent, 3, 3),
        "encoder.conv_in.weight": (widths[0], c["in_channels"], 3, 3),
        "decoder.conv_out.weight": (c["out_channels"], widths[0], 3, 3),
        f"encoder.down.{blocks - 1}.block.{layers - 1}.conv2.weight": (widths[-1], widths[-1], 3, 3),
        f"encoder.down.{blocks}.block.0.conv2.weight": None,
        f"encoder.down.0.block.{layers}.conv2.weight": None,
        f"decoder.up.0.block.{layers}.conv2.weight": (widths[0], widths[0], 3, 3),
        f"decoder.up.0.block.{layers + 1}.conv2.weight": None,
        "quant_conv.weight": (2 * latent, 2 * latent, 1, 1) if c.get("use_quant_conv", True) else None,
        "post_quant_conv.weight": (latent, latent, 1, 1) if c.get("use_post_quant_conv", True) else None,
    }


def vae_refusal(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """What an original-layout VAE file that fits no shipped FLUX.1 config is, when its latent channels say it."""
    from invokeai.backend.families.flux.constants import LATENT_CHANNELS

    moments = shapes.get("encoder.conv_out.weight")
    if not moments or moments[0] // 2 == LATENT_CHANNELS:
        return None
    return (
        f"a VAE of {moments[0] // 2} latent channels (as SD-1's and SDXL's), not FLUX.1's VAE (ae.safetensors, "
        f"{LATENT_CHANNELS} latent channels, which FLUX.1 and Z-Image take); a lone VAE file of "
        f"{moments[0] // 2} latent channels is not supported"
    )


def write_original_vae(vae: torch.nn.Module, path: Path) -> None:
    """An AutoencoderKL as one safetensors file in the original (LDM) names, as Black Forest Labs' ae.safetensors
    is laid out (for fixtures: the demo's VAE as a downloaded one)."""
    from invokeai.backend.models.original_sd_layout import (
        VAE_RESNET_NAMES,
        rename_to_original,
        save_checkpoint,
        vae_key_map,
    )

    config = dict(vae.config)  # type: ignore[attr-defined]
    save_checkpoint(rename_to_original(vae.state_dict(), vae_key_map(config), "", VAE_RESNET_NAMES), path)


def load_original_vae(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """An AutoencoderKL from an original-layout VAE file, configured by `variant`'s VAE config, on the CPU in
    `dtype`; diffusers' single-file loader converts the names."""
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_single_file(
        str(path), config=str(variant.path), subfolder="vae", local_files_only=True, torch_dtype=dtype
    )
