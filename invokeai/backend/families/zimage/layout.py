"""Z-Image's single files as people download them: the transformer in the original (Tongyi-MAI / ComfyUI) names
(the Qwen3 text encoder file is `invokeai/backend/models/qwen3_encoder_file.py`'s, shared with Anima; the VAE is
FLUX.1's ae.safetensors).

The original layout, which ComfyUI's `diffusion_models/z_image_*.safetensors` and the published GGUF files use
(optionally under `model.diffusion_model.`), differs from diffusers' ZImageTransformer2DModel in a few names only:
`x_embedder` / `final_layer` are diffusers' `all_x_embedder.2-1` / `all_final_layer.2-1` (one patch size), each
attention's `out` is `to_out.0`, its `q_norm` / `k_norm` are `norm_q` / `norm_k`, and its q, k and v are one fused
`qkv` weight (rows q, k, v). Some files also carry an unused `norm_final.weight`.

diffusers converts the original names itself, but its string replacement garbles names already in diffusers' form
("final_layer." inside "all_final_layer."), so `from_original` here maps either layout and every file is handed to
diffusers in its names (diffusers then skips its own conversion). Row splits and concatenations keep quantized GGUF
rows whole, so both directions work on GGUF parameters too. `to_original` is the other direction, for fixtures and
the GGUF demo.

Recognition and shape signatures use diffusers' names (`canonical_name`), with the fused `qkv` left as it is: the
signature pins the width (x_embedder, final layer), the caption width (cap_embedder), the head dim (the q norm), the
feed-forward width, the three block counts (last present, next absent) and refuses Omni files (a SigLIP embedder).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.models.config_variants import ConfigVariant, Signature

PREFIX = "model.diffusion_model."
PATCH_KEY = "2-1"  # all_patch_size (2,) with all_f_patch_size (1,): the only patching the published models use
# Original-name pieces -> diffusers-name pieces, applied in order (whole leading segments, then inside blocks).
_LEADING = (("x_embedder.", f"all_x_embedder.{PATCH_KEY}."), ("final_layer.", f"all_final_layer.{PATCH_KEY}."))
_INNER = (
    (".attention.out.", ".attention.to_out.0."),
    (".attention.q_norm.", ".attention.norm_q."),
    (".attention.k_norm.", ".attention.norm_k."),
)
_FUSED = ".attention.qkv.weight"
_PARTS = (".attention.to_q.weight", ".attention.to_k.weight", ".attention.to_v.weight")
_UNUSED = ("norm_final.weight",)
# diffusers names every Z-Image transformer has. The layers' modulation without a SiLU in front
# (`adaLN_modulation.0`) tells Z-Image from Lumina-Image-2.0, whose NextDiT has the same embedders and refiners but
# `adaLN_modulation.1`.
MARKERS = (
    f"all_x_embedder.{PATCH_KEY}.weight",
    "cap_embedder.1.weight",
    "layers.0.adaLN_modulation.0.weight",
    "noise_refiner.0.adaLN_modulation.0.weight",
    "context_refiner.0.attention_norm1.weight",
    "t_embedder.mlp.0.weight",
)


def canonical_name(name: str) -> str:
    """A transformer tensor's diffusers name, whichever layout `name` is in (a fused qkv keeps its name)."""
    name = name.removeprefix(PREFIX)
    if name.startswith("all_"):
        return name
    for old, new in _LEADING:
        if name.startswith(old):
            return new + name[len(old) :]
    for old, new in _INNER:
        name = name.replace(old, new)
    return name


def is_transformer(names: Iterable[str]) -> bool:
    present = {canonical_name(name) for name in names}
    return all(marker in present for marker in MARKERS)


def from_original(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A transformer state dict in either layout (prefix or not) in diffusers names; a fused qkv is split in three
    equal row blocks (Z-Image's attention has as many key-value heads as query heads)."""
    out: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        canonical = canonical_name(name)
        if canonical in _UNUSED:
            continue
        if canonical.endswith(_FUSED):
            stem = canonical.removesuffix(_FUSED)
            if tensor.shape[0] % 3:
                raise ValueError(f"{name} has {tensor.shape[0]} rows, not three equal q, k and v blocks")
            for part, piece in zip(_PARTS, tensor.chunk(3, dim=0), strict=True):
                out[stem + part] = piece
        else:
            out[canonical] = tensor
    missing = [marker for marker in MARKERS if marker not in out]
    if missing:
        raise ValueError(f"not a Z-Image transformer: lacks {', '.join(missing)}")
    return out


def to_original(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers ZImageTransformer2DModel state dict in the original names (without the checkpoint prefix)."""
    sd = dict(state_dict)
    out: dict[str, torch.Tensor] = {}
    for name in [n for n in sd if n.endswith(_PARTS[0])]:
        stem = name.removesuffix(_PARTS[0])
        out[stem + _FUSED] = torch.cat([sd.pop(stem + part) for part in _PARTS], dim=0)
    for name, tensor in sd.items():
        for original, diffusers_piece in _LEADING:
            if name.startswith(diffusers_piece):
                name = original + name[len(diffusers_piece) :]
                break
        else:
            for original, diffusers_piece in _INNER:
                name = name.replace(diffusers_piece, original)
        out[name] = tensor
    return out


def transformer_signature(variant: ConfigVariant) -> Signature:
    """Shapes (diffusers names, fused qkv aside) a transformer file made for `variant` has."""
    c = variant.component_config("transformer")
    dim, heads = c["dim"], c["n_heads"]
    patch, frames = c["all_patch_size"][0], c["all_f_patch_size"][0]
    patch_in = patch * patch * frames * c["in_channels"]
    layers, refiners = c["n_layers"], c["n_refiner_layers"]
    return {
        f"all_x_embedder.{PATCH_KEY}.weight": (dim, patch_in),
        f"all_final_layer.{PATCH_KEY}.linear.weight": (patch_in, dim),
        "cap_embedder.1.weight": (dim, c["cap_feat_dim"]),
        "layers.0.attention.norm_q.weight": (dim // heads,) if c.get("qk_norm", True) else None,
        "layers.0.feed_forward.w1.weight": (int(dim / 3 * 8), dim),
        f"layers.{layers - 1}.attention_norm1.weight": (dim,),
        f"layers.{layers}.attention_norm1.weight": None,
        f"noise_refiner.{refiners - 1}.attention_norm1.weight": (dim,),
        f"noise_refiner.{refiners}.attention_norm1.weight": None,
        f"context_refiner.{refiners - 1}.attention_norm1.weight": (dim,),
        f"context_refiner.{refiners}.attention_norm1.weight": None,
        "siglip_embedder.1.weight": None,
    }


def write_original_safetensors(transformer: torch.nn.Module, path: Path, *, prefix: str = "") -> None:
    """The transformer as one safetensors file in the original names (under `prefix`, e.g. PREFIX, if given)."""
    from safetensors.torch import save_file

    original = to_original(transformer.state_dict())
    save_file({prefix + name: tensor.contiguous() for name, tensor in original.items()}, str(path))


def write_original_gguf(
    transformer: torch.nn.Module, path: Path, quant_type: str = "Q8_0", *, every_matrix: bool = True
) -> dict[str, str]:
    """The transformer as a GGUF file the way the published ones are laid out: original names, and (as the common
    converters do) every 2-D tensor whose rows fit the quantization blocks quantized, the pad tokens included;
    1-D tensors F32. `every_matrix=False` quantizes Linear weights only. Returns each tensor's stored type."""
    from invokeai.backend.models.gguf_export import write_gguf

    original = to_original(transformer.state_dict())
    if every_matrix:
        quantize = {name for name, tensor in original.items() if tensor.dim() == 2}
    else:
        linear = {f"{name}.weight" for name, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}
        quantize = set(to_original({name: torch.empty(3, 1) for name in linear}))
    # Converters name the architecture after ComfyUI's model class for this layout (its NextDiT is Lumina 2's).
    return write_gguf(original, path, quantize=quantize, quant_type=quant_type, arch="lumina2")


def _load_into_diffusers(
    state_dict: Mapping[str, Any], variant: ConfigVariant, dtype: torch.dtype, **kwargs: Any
) -> Any:
    from diffusers import ZImageTransformer2DModel

    # Passed as a dict of diffusers names: diffusers then skips its own conversion (see the module docstring).
    return ZImageTransformer2DModel.from_single_file(
        from_original(state_dict),
        config=str(variant.path),
        subfolder="transformer",
        local_files_only=True,
        torch_dtype=dtype,
        **kwargs,
    )


def load_safetensors(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """A ZImageTransformer2DModel from a safetensors file (original or diffusers names), on the CPU in `dtype`."""
    from safetensors.torch import load_file

    return _load_into_diffusers(load_file(str(path)), variant, dtype)


def load_gguf(path: Path, variant: ConfigVariant, dtype: torch.dtype) -> Any:
    """A ZImageTransformer2DModel from a GGUF file through diffusers' GGUF quantizer: Linear weights stay quantized
    (dequantized to `dtype` on every call); everything else (pad tokens, norms) is dequantized once here."""
    from diffusers import GGUFQuantizationConfig
    from diffusers.models.model_loading_utils import load_gguf_checkpoint

    from invokeai.backend.models.load_gguf import dequantize_non_linear

    model = _load_into_diffusers(
        load_gguf_checkpoint(str(path)), variant, dtype, quantization_config=GGUFQuantizationConfig(compute_dtype=dtype)
    )
    dequantize_non_linear(model, dtype)
    return model
