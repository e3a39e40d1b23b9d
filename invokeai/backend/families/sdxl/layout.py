"""SDXL's original single-file layout (Stability's SGM repository): recognition, config signature, and the writer.

An SGM checkpoint keeps each component under one prefix: the UNet under `model.diffusion_model.` (LDM names, its
text_time embedding as `label_emb.0.*`), the VAE under `first_stage_model.`, CLIP ViT-L under
`conditioner.embedders.0.transformer.text_model.` (transformers names) and OpenCLIP ViT-bigG under
`conditioner.embedders.1.model.` in OpenCLIP's own names (fused q/k/v `in_proj_*`, `text_projection` stored
transposed). Which shipped config variant fits a file is read off tensors whose shapes follow from the configs.

diffusers only converts SGM to diffusers (in its single-file loader); `pipeline_to_checkpoint` writes the other
way, for demo and test files, and loading its output back with diffusers' `from_single_file` is the check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.models.config_variants import ConfigVariant, Signature
from invokeai.backend.models.original_sd_layout import (
    UNET_RESNET_NAMES,
    VAE_RESNET_NAMES,
    load_component_weights,
    rename_to_original,
    save_checkpoint,
    unet_key_map,
    vae_key_map,
)

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
TEXT_PREFIX = "conditioner.embedders.0.transformer.text_model."
TEXT_2_PREFIX = "conditioner.embedders.1.model."
# The component each prefix holds; `conditioner.embedders.1.` tells SDXL base from SD-1 (cond_stage_model) and from
# the SDXL refiner (whose only text encoder, OpenCLIP, is embedders.0).
CHECKPOINT_PREFIXES = {
    "unet": UNET_PREFIX,
    "vae": VAE_PREFIX,
    "text_encoder": TEXT_PREFIX,
    "text_encoder_2": TEXT_2_PREFIX,
}


def missing_checkpoint_parts(names: Iterable[str]) -> list[str]:
    """Components whose SGM prefix no tensor in `names` has (empty: the layout is SDXL base's)."""
    names = list(names)
    return [
        f"{component} ({prefix}*)"
        for component, prefix in CHECKPOINT_PREFIXES.items()
        if not any(name.startswith(prefix) for name in names)
    ]


def is_checkpoint(names: Iterable[str]) -> bool:
    return not missing_checkpoint_parts(names)


def checkpoint_signature(variant: ConfigVariant) -> Signature:
    """Tensor shapes an SGM file made for `variant`'s configs has: the UNet's conv in/out, time and text_time
    embeddings, the mid block's cross-attention width and transformer depth; the VAE's convs; both text encoders'
    embeddings, projection, last layer and the absence of a layer past it."""
    unet = variant.component_config("unet")
    vae = variant.component_config("vae")
    text = variant.component_config("text_encoder")
    text_2 = variant.component_config("text_encoder_2")
    width, deepest = unet["block_out_channels"][0], unet["block_out_channels"][-1]
    depth = unet.get("transformer_layers_per_block", 1)
    mid_depth = depth[-1] if isinstance(depth, list) else depth
    vae_width, vae_deepest = vae["block_out_channels"][0], vae["block_out_channels"][-1]
    latent = vae["latent_channels"]
    u, v, t, g = UNET_PREFIX, VAE_PREFIX, TEXT_PREFIX, TEXT_2_PREFIX
    mid = f"{u}middle_block.1.transformer_blocks"
    layers, layers_2 = text["num_hidden_layers"], text_2["num_hidden_layers"]
    hidden, hidden_2 = text["hidden_size"], text_2["hidden_size"]
    return {
        f"{u}input_blocks.0.0.weight": (width, unet["in_channels"], 3, 3),
        f"{u}out.2.weight": (unet["out_channels"], width, 3, 3),
        f"{u}time_embed.0.weight": (4 * width, width),
        f"{u}label_emb.0.0.weight": (4 * width, unet["projection_class_embeddings_input_dim"]),
        f"{mid}.0.attn2.to_k.weight": (deepest, unet["cross_attention_dim"]),
        f"{mid}.{mid_depth - 1}.attn1.to_q.weight": (deepest, deepest),
        f"{mid}.{mid_depth}.attn1.to_q.weight": None,
        f"{v}encoder.conv_in.weight": (vae_width, vae["in_channels"], 3, 3),
        f"{v}decoder.conv_out.weight": (vae["out_channels"], vae_width, 3, 3),
        f"{v}encoder.mid.block_1.conv1.weight": (vae_deepest, vae_deepest, 3, 3),
        f"{v}quant_conv.weight": (2 * latent, 2 * latent, 1, 1),
        f"{v}post_quant_conv.weight": (latent, latent, 1, 1),
        f"{t}embeddings.token_embedding.weight": (text["vocab_size"], hidden),
        f"{t}embeddings.position_embedding.weight": (text["max_position_embeddings"], hidden),
        f"{t}encoder.layers.{layers - 1}.mlp.fc1.weight": (text["intermediate_size"], hidden),
        f"{t}encoder.layers.{layers}.mlp.fc1.weight": None,
        f"{g}token_embedding.weight": (text_2["vocab_size"], hidden_2),
        f"{g}positional_embedding": (text_2["max_position_embeddings"], hidden_2),
        f"{g}text_projection": (hidden_2, text_2["projection_dim"]),
        f"{g}transformer.resblocks.{layers_2 - 1}.mlp.c_fc.weight": (text_2["intermediate_size"], hidden_2),
        f"{g}transformer.resblocks.{layers_2}.mlp.c_fc.weight": None,
    }


# --- writing SGM files from diffusers folders ---------------------------------------------------------------

# transformers CLIP names inside one encoder layer -> OpenCLIP's (q, k and v are fused separately).
_OPEN_CLIP_LAYER = (
    ("layer_norm1.", "ln_1."),
    ("layer_norm2.", "ln_2."),
    ("mlp.fc1.", "mlp.c_fc."),
    ("mlp.fc2.", "mlp.c_proj."),
    ("self_attn.out_proj.", "attn.out_proj."),
)
_OPEN_CLIP_TOP = {
    "embeddings.token_embedding.weight": "token_embedding.weight",
    "embeddings.position_embedding.weight": "positional_embedding",
    "final_layer_norm.weight": "ln_final.weight",
    "final_layer_norm.bias": "ln_final.bias",
}


def _text_model_keys(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # transformers >= 5.6 saves CLIPTextModel without its "text_model." level, CLIPTextModelWithProjection with it.
    return {key.removeprefix("text_model."): value for key, value in state.items()}


def open_clip_state_dict(text_encoder_2: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CLIPTextModelWithProjection state dict in OpenCLIP's names (without the SGM prefix)."""
    state = _text_model_keys(text_encoder_2)
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        if key in _OPEN_CLIP_TOP:
            out[_OPEN_CLIP_TOP[key]] = tensor
        elif key == "text_projection.weight":
            # OpenCLIP computes x @ text_projection; transformers' Linear stores the transpose.
            out["text_projection"] = tensor.T.contiguous()
        elif key.startswith("encoder.layers."):
            index, rest = key.removeprefix("encoder.layers.").split(".", 1)
            block = f"transformer.resblocks.{index}."
            if rest.startswith("self_attn.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
                kind = rest.rsplit(".", 1)[1]  # weight or bias
                fused.setdefault(f"{block}attn.in_proj_{kind}", {})[rest.split(".")[1]] = tensor
                continue
            for old, new in _OPEN_CLIP_LAYER:
                if rest.startswith(old):
                    rest = new + rest[len(old) :]
                    break
            else:
                raise ValueError(f"text_encoder_2 tensor {key!r} has no OpenCLIP name")
            out[block + rest] = tensor
        elif key != "embeddings.position_ids":
            raise ValueError(f"text_encoder_2 tensor {key!r} has no OpenCLIP name")
    for name, parts in fused.items():
        out[name] = torch.cat([parts["q_proj"], parts["k_proj"], parts["v_proj"]], dim=0)
    return out


def state_dicts_to_checkpoint(
    unet: dict[str, torch.Tensor],
    vae: dict[str, torch.Tensor],
    text_encoder: dict[str, torch.Tensor],
    text_encoder_2: dict[str, torch.Tensor],
    unet_config: dict[str, Any],
    vae_config: dict[str, Any],
) -> dict[str, torch.Tensor]:
    """diffusers-named component state dicts -> one SGM-layout state dict (sorted by name)."""
    # The UNet map follows the config's blocks; SDXL adds the text_time embedding, LDM's label_emb.
    unet_map = unet_key_map(unet_config) | {
        "add_embedding.linear_1.": "label_emb.0.0.",
        "add_embedding.linear_2.": "label_emb.0.2.",
    }
    tensors = rename_to_original(unet, unet_map, UNET_PREFIX, UNET_RESNET_NAMES)
    tensors |= rename_to_original(vae, vae_key_map(vae_config), VAE_PREFIX, VAE_RESNET_NAMES)
    tensors |= {TEXT_PREFIX + key: value for key, value in _text_model_keys(text_encoder).items()}
    tensors |= {TEXT_2_PREFIX + key: value for key, value in open_clip_state_dict(text_encoder_2).items()}
    return dict(sorted(tensors.items()))


def pipeline_to_checkpoint(pipeline_dir: Path, dest: Path, dtype: torch.dtype | None = None) -> Path:
    """Write `pipeline_dir` (an SDXL diffusers folder, safetensors weights) as one SGM-layout file at `dest`, in
    `dtype` (default: as stored; float16 gives the files people download); it appears complete or not at all."""
    pipeline_dir = Path(pipeline_dir)

    def config(component: str) -> dict[str, Any]:
        return json.loads((pipeline_dir / component / "config.json").read_text(encoding="utf-8"))

    tensors = state_dicts_to_checkpoint(
        load_component_weights(pipeline_dir / "unet"),
        load_component_weights(pipeline_dir / "vae"),
        load_component_weights(pipeline_dir / "text_encoder"),
        load_component_weights(pipeline_dir / "text_encoder_2"),
        config("unet"),
        config("vae"),
    )
    if dtype is not None:
        tensors = {key: value.to(dtype) if value.is_floating_point() else value for key, value in tensors.items()}
    return save_checkpoint(tensors, dest)
