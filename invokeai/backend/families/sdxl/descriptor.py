"""Stable Diffusion XL base 1.0 and its fine-tunes: diffusers folders and SGM-layout single files (fp32 or fp16)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from invokeai.backend.families.family import DemoModel, Family, FileRule, GraphFacts, InvokeAIFacts
from invokeai.backend.families.sd_records import sd_describer
from invokeai.backend.families.sd_schedulers import SD_SCHEDULER_NAMES, make_sd_scheduler
from invokeai.backend.families.sdxl import demo, estimators, layout, load_checkpoint, runs
from invokeai.backend.families.sdxl.constants import (
    COMPONENTS,
    CONSTANTS,
    FAMILY_NAME,
    MODULE_COMPONENTS,
    OPERATIONS,
    PIPELINE_CLASS,
)
from invokeai.backend.models.config_variants import ConfigVariant

CONFIGS = Path(__file__).parent / "configs"
TIME_IDS = 6  # original size, crop corner, target size: what the base model's add embedding takes


def folder_differences(configs: Mapping[str, dict[str, Any]]) -> list[str]:
    """How a StableDiffusionXLPipeline folder differs from what the sdxl nodes run (SDXL base text-to-image and
    image-to-image, epsilon prediction); empty: it runs. Caught at install rather than as a shape error at denoise."""
    unet, scheduler = configs.get("unet") or {}, configs.get("scheduler") or {}
    text, text_2 = configs.get("text_encoder") or {}, configs.get("text_encoder_2") or {}
    found = []
    if not text:
        found.append("it has no first text encoder (CLIP ViT-L): an SDXL refiner, which the sdxl nodes do not run")
    in_channels = unet.get("in_channels", 4)
    if in_channels != 4:
        kind = " (an inpainting UNet)" if in_channels == 9 else ""
        found.append(f"its UNet takes {in_channels} input channels{kind}; SDXL denoising takes 4")
    if unet.get("time_cond_proj_dim") is not None:
        found.append(f"its UNet is LCM-distilled (time_cond_proj_dim {unet['time_cond_proj_dim']})")
    if unet.get("addition_embed_type") != "text_time":
        found.append(f"its UNet's addition_embed_type is {unet.get('addition_embed_type')!r}; SDXL's is 'text_time'")
    prediction = scheduler.get("prediction_type", "epsilon")
    if prediction != "epsilon":
        found.append(f"its scheduler predicts {prediction!r}; the sdxl nodes run epsilon prediction")
    if text and text_2:
        width = text.get("hidden_size", 0) + text_2.get("hidden_size", 0)
        if unet.get("cross_attention_dim") not in (None, width):
            found.append(
                f"its UNet's cross_attention_dim {unet.get('cross_attention_dim')} is not the two text encoders' "
                f"widths together ({width})"
            )
        time_dim = unet.get("addition_time_embed_dim")
        # With requires_aesthetics_score, StableDiffusionXLImg2ImgPipeline passes the score in the target size's
        # place, five time ids: a UNet trained so runs image-to-image (text-to-image refuses it, as the pipeline).
        aesthetic = bool((configs.get("model_index") or {}).get("requires_aesthetics_score", False))
        counts = (TIME_IDS, TIME_IDS - 1) if aesthetic else (TIME_IDS,)
        accepted = [count * time_dim + text_2.get("projection_dim", 0) for count in counts] if time_dim else []
        if accepted and unet.get("projection_class_embeddings_input_dim") not in accepted:
            found.append(
                f"its UNet's add embedding takes {unet.get('projection_class_embeddings_input_dim')} features, not "
                f"{TIME_IDS} time ids and the pooled text ({accepted[0]}): a refiner's aesthetic-score conditioning "
                "(which needs model_index.json's requires_aesthetics_score)?"
            )
    return found


FAMILY = Family(
    name=FAMILY_NAME,
    title="Stable Diffusion XL",
    pipeline_classes=(PIPELINE_CLASS,),
    components=COMPONENTS,
    module_components=MODULE_COMPONENTS,
    constants=CONSTANTS,
    operations=OPERATIONS,
    estimators=estimators.ESTIMATORS,
    runs=runs.RUNS,
    scheduler_names=SD_SCHEDULER_NAMES,
    make_scheduler=make_sd_scheduler,
    node_module="invokeai.app.nodes.sdxl",
    graph=GraphFacts(
        text_encoder="sdxl_text_encoder",
        denoise="sdxl_denoise",
        decode="sdxl_vae_decode",
        encode="sdxl_vae_encode",
        # Without a negative prompt the pipeline guides against zeros (force_zeros_for_empty_prompt).
        negative="when_given",
        second_prompt_label="Second prompt (OpenCLIP ViT-bigG)",
    ),
    config_variants=(
        # Named after the family, as the other families' full-size variants are.
        ConfigVariant(
            FAMILY_NAME,
            FAMILY_NAME,
            "Stable Diffusion XL base 1.0 (CLIP ViT-L/14 + OpenCLIP ViT-bigG/14, 2.6B UNet, f8 VAE) with the real "
            "CLIP tokenizers",
            CONFIGS / "sdxl",
        ),
        ConfigVariant("sdxl-demo", FAMILY_NAME, "the tiny random-weight demo-sdxl architecture", CONFIGS / "sdxl-demo"),
    ),
    files=(
        FileRule(
            container="safetensors",
            format="checkpoint",
            type="main",
            what="SDXL checkpoint",
            components=COMPONENTS,
            matches=layout.is_checkpoint,
            signature=layout.checkpoint_signature,
            load=load_checkpoint.load_checkpoint_component,
        ),
    ),
    demos=(
        DemoModel(
            name=demo.NAME,
            description=demo.DESCRIPTION,
            type="main",
            format="diffusers",
            filename=demo.NAME,
            build=demo.build,
        ),
    ),
    folder_check=folder_differences,
    checked_configs=("unet", "scheduler", "text_encoder", "text_encoder_2"),
    # The model_index.json flags StableDiffusionXLPipeline (force_zeros_for_empty_prompt) and its Img2Img pipeline
    # (both) read at call time, with their defaults; the pipelines rewrite no component config.
    pipeline_options={"force_zeros_for_empty_prompt": True, "requires_aesthetics_score": False},
    lookalikes=(
        (
            "an SDXL refiner checkpoint (OpenCLIP-G as its only text encoder, under conditioner.embedders.0.model)",
            ("conditioner.embedders.0.model.",),
        ),
    ),
    invokeai=InvokeAIFacts(base="sdxl", describe=sd_describer(1024)),
)
