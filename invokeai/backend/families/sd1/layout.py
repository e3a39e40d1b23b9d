"""Stable Diffusion 1.x: components, the original single-file key layout, and its config signature.

A single-file checkpoint in the original (CompVis/LDM) layout keeps each component under one prefix. Which shipped
config variant fits a file is read off a few tensors whose shapes follow from the config: the UNet's conv_in, conv_out,
time embedding and mid-block cross-attention width, the VAE's conv_in/out and (post-)quant convs, and the text
encoder's token and position embeddings, last layer, and the absence of a layer past it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from invokeai.backend.models.config_variants import ConfigVariant, Signature

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
TEXT_PREFIX = "cond_stage_model.transformer.text_model."
CHECKPOINT_PREFIXES = {"unet": UNET_PREFIX, "vae": VAE_PREFIX, "text_encoder": TEXT_PREFIX}

# OpenCLIP ViT-H's width: the text embeddings Stable Diffusion 2.x's UNet attends over (SD-1.5's CLIP ViT-L is 768).
SD2_TEXT_WIDTH = 1024


def folder_differences(configs: Mapping[str, dict[str, Any]]) -> list[str]:
    """`pipeline_differences` of a folder's unet, scheduler and text_encoder configs."""
    return pipeline_differences(configs["unet"], configs["scheduler"], configs["text_encoder"])


def is_checkpoint(names: Iterable[str]) -> bool:
    """Every component's original-layout prefix is present (the CLIP ViT-L text encoder under cond_stage_model)."""
    return not missing_checkpoint_parts(names)


def pipeline_differences(unet: dict[str, Any], scheduler: dict[str, Any], text_encoder: dict[str, Any]) -> list[str]:
    """How a diffusers pipeline folder's configs differ from what this family's nodes run: SD-1.5 text-to-image and
    image-to-image, epsilon prediction. Each entry names the difference; empty: the folder is one this family runs.
    Folders that pass StableDiffusionPipeline's class check but are another model are caught here, at install,
    instead of failing at denoise or sampling wrongly."""
    found = []
    in_channels = unet.get("in_channels", 4)
    if in_channels != 4:
        kind = " (an inpainting UNet: latents, mask and masked image)" if in_channels == 9 else ""
        found.append(f"its UNet takes {in_channels} input channels{kind}; SD-1.5 denoising takes 4")
    if unet.get("time_cond_proj_dim") is not None:
        found.append(
            f"its UNet is LCM-distilled (time_cond_proj_dim {unet['time_cond_proj_dim']}): it needs LCM's guidance "
            "embedding and scheduler, which the sd-1 nodes do not run"
        )
    prediction = scheduler.get("prediction_type", "epsilon")
    if prediction != "epsilon":
        found.append(
            f"its scheduler predicts {prediction!r} (Stable Diffusion 2.x 768-v does); SD-1.5 predicts epsilon"
        )
    cross, text_width = unet.get("cross_attention_dim"), text_encoder.get("hidden_size")
    if cross == SD2_TEXT_WIDTH:
        found.append(
            f"its UNet attends over {cross}-wide text embeddings (Stable Diffusion 2.x's OpenCLIP text encoder)"
        )
    elif cross is not None and text_width is not None and cross != text_width:
        found.append(f"its UNet's cross_attention_dim {cross} is not its text encoder's width {text_width}")
    return found


def missing_checkpoint_parts(names: Iterable[str]) -> list[str]:
    """Components whose original-layout prefix no tensor in `names` has (empty: the layout is SD-1.x's)."""
    names = list(names)
    return [
        f"{component} ({prefix}*)"
        for component, prefix in CHECKPOINT_PREFIXES.items()
        if not any(name.startswith(prefix) for name in names)
    ]


def checkpoint_signature(variant: ConfigVariant) -> Signature:
    unet = variant.component_config("unet")
    vae = variant.component_config("vae")
    text = variant.component_config("text_encoder")
    width = unet["block_out_channels"][0]
    deepest = unet["block_out_channels"][-1]
    vae_width = vae["block_out_channels"][0]
    vae_deepest = vae["block_out_channels"][-1]
    latent = vae["latent_channels"]
    hidden = text["hidden_size"]
    layers = text["num_hidden_layers"]
    u, v, t = UNET_PREFIX, VAE_PREFIX, TEXT_PREFIX
    return {
        f"{u}input_blocks.0.0.weight": (width, unet["in_channels"], 3, 3),
        f"{u}out.2.weight": (unet["out_channels"], width, 3, 3),
        f"{u}time_embed.0.weight": (4 * width, width),
        f"{u}middle_block.1.transformer_blocks.0.attn2.to_k.weight": (deepest, unet["cross_attention_dim"]),
        f"{v}encoder.conv_in.weight": (vae_width, vae["in_channels"], 3, 3),
        f"{v}decoder.conv_out.weight": (vae["out_channels"], vae_width, 3, 3),
        f"{v}encoder.mid.block_1.conv1.weight": (vae_deepest, vae_deepest, 3, 3),
        f"{v}quant_conv.weight": (2 * latent, 2 * latent, 1, 1),
        f"{v}post_quant_conv.weight": (latent, latent, 1, 1),
        f"{t}embeddings.token_embedding.weight": (text["vocab_size"], hidden),
        f"{t}embeddings.position_embedding.weight": (text["max_position_embeddings"], hidden),
        f"{t}encoder.layers.{layers - 1}.mlp.fc1.weight": (text["intermediate_size"], hidden),
        f"{t}encoder.layers.{layers}.mlp.fc1.weight": None,
    }
