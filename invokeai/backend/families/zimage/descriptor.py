"""The Z-Image family descriptor: diffusers ZImagePipeline folders, single-file transformers in the original
(Tongyi-MAI / ComfyUI) names as safetensors and GGUF, the Qwen3 text encoder as ComfyUI's single file, the demo
models, the estimators and the nodes.

Imports no diffusers or transformers at import time (the server imports every descriptor at startup).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.families.family import DemoModel, Family, FileRule, GraphFacts, InvokeAIFacts
from invokeai.backend.families.zimage import constants as c
from invokeai.backend.families.zimage import estimators, layout, records, runs
from invokeai.backend.models import qwen3_encoder_file
from invokeai.backend.models.config_variants import ConfigVariant

NAME = c.NAME
PIPELINE_CLASSES = ("ZImagePipeline", "ZImageImg2ImgPipeline")
CONFIGS = Path(__file__).parent / "configs"
# Flow-matching samplers that take the pipeline's own schedule (its sigmas and shift mu) on the model's config:
# Euler, the pipeline's, and LCM (its step re-noises the clean estimate, with noise from the seed's generator).
# FlowMatchHeunDiscreteScheduler is left out: its set_timesteps takes neither sigmas nor mu, so it would sample
# another schedule than the one the model was distilled for.
SCHEDULERS = {"euler": "FlowMatchEulerDiscreteScheduler", "lcm": "FlowMatchLCMScheduler"}
SCHEDULER_NAMES = tuple(SCHEDULERS)

CONFIG_VARIANTS = (
    ConfigVariant(
        "z-image",
        NAME,
        "Z-Image transformer (30 layers, dim 3840, 30 heads, 2 + 2 refiners: Turbo's and Base's shapes alike), "
        "Turbo's scheduler, Qwen3-4B text encoder config, FLUX.1 VAE; no tokenizer",
        CONFIGS / "z-image",
    ),
    ConfigVariant("zimage-demo", NAME, "the tiny random-weight demo-zimage architecture", CONFIGS / "zimage-demo"),
)


def make_scheduler(name: str, base_config: Mapping[str, Any]) -> Any:
    """A flow-matching sampler on the model's own scheduler config (its shift, and its dynamic shifting if set)."""
    import diffusers

    from invokeai.backend.models.schedulers import new_scheduler

    if name not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {name!r} for {NAME}; known: {', '.join(SCHEDULER_NAMES)}")
    return new_scheduler(getattr(diffusers, SCHEDULERS[name]), dict(base_config))


def folder_check(configs: Mapping[str, dict[str, Any]]) -> list[str]:
    """How a ZImagePipeline folder differs from what the z-image nodes run (text-to-image and image-to-image with
    one 2x2 patching, 16-channel latents, caption features as wide as the text encoder); empty: it runs."""
    found = []
    transformer, vae = configs.get("transformer", {}), configs.get("vae", {})
    text_encoder = configs.get("text_encoder", {})
    channels = vae.get("latent_channels", c.LATENT_CHANNELS)
    in_channels = transformer.get("in_channels", c.LATENT_CHANNELS)
    if in_channels != channels:
        found.append(f"its transformer takes {in_channels} latent channels, its VAE makes {channels}")
    if list(transformer.get("all_patch_size", [c.PATCH])) != [c.PATCH] or list(
        transformer.get("all_f_patch_size", [1])
    ) != [1]:
        found.append(
            f"its transformer patches {transformer.get('all_patch_size')} x {transformer.get('all_f_patch_size')}; "
            "the nodes run one 2x2 patching of one frame"
        )
    if transformer.get("siglip_feat_dim") is not None:
        found.append("its transformer takes SigLIP image features (Z-Image Omni), which the nodes do not provide")
    hidden = text_encoder.get("hidden_size")
    if hidden is not None and hidden != transformer.get("cap_feat_dim", hidden):
        found.append(
            f"its text encoder's hidden states are {hidden} wide, its transformer takes {transformer['cap_feat_dim']}"
        )
    scheduler = configs.get("scheduler", {}).get("_class_name", "FlowMatchEulerDiscreteScheduler")
    if scheduler != "FlowMatchEulerDiscreteScheduler":
        found.append(f"its scheduler is {scheduler}; Z-Image samples with FlowMatchEulerDiscreteScheduler")
    return found


def _load_checkpoint(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return layout.load_safetensors(path, variant, dtype)


def _load_gguf(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return layout.load_gguf(path, variant, dtype)


def _load_text_encoder(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return qwen3_encoder_file.load_text_encoder(path, variant, dtype)


def _matches(names: Iterable[str]) -> bool:
    return layout.is_transformer(names)


def _matches_text_encoder(names: Iterable[str]) -> bool:
    return qwen3_encoder_file.is_text_encoder(names)


def _text_encoder_refusal(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    return qwen3_encoder_file.text_encoder_refusal(
        shapes, CONFIG_VARIANTS, "Z-Image", "Qwen3-4B (ComfyUI's qwen_3_4b.safetensors)"
    )


# ComfyUI's split files: the transformer (diffusion_models/, or GGUF), the Qwen3 text encoder (text_encoders/
# qwen_3_4b.safetensors, recorded as InvokeAI's qwen3_encoder; its tokenizer comes from the installed Z-Image
# pipeline whose text encoder has its architecture) and the VAE (vae/ae.safetensors: FLUX.1's, that family's file).
FILES = (
    *(
        FileRule(
            container=container,
            format=format,
            type="transformer",
            what="Z-Image transformer",
            components=("transformer",),
            matches=_matches,
            signature=layout.transformer_signature,
            load=load,
            canonical_name=layout.canonical_name,
        )
        for container, format, load in (
            ("safetensors", "checkpoint", _load_checkpoint),
            ("gguf", "gguf", _load_gguf),
        )
    ),
    FileRule(
        container="safetensors",
        format="checkpoint",
        type="qwen3_encoder",
        what="Qwen3 text encoder (ComfyUI's qwen_3_4b.safetensors)",
        components=("text_encoder",),
        matches=_matches_text_encoder,
        signature=qwen3_encoder_file.text_encoder_signature,
        load=_load_text_encoder,
        canonical_name=qwen3_encoder_file.text_encoder_name,
        refusal=_text_encoder_refusal,
    ),
)


def _build_demo(path: Path) -> None:
    from invokeai.backend.families.zimage import demo

    demo.build(path)


def _build_demo_gguf(path: Path) -> None:
    from invokeai.backend.families.zimage import demo

    demo.build_gguf(path)


DEMOS = (
    DemoModel(
        name="demo-zimage",
        description="Random-weight Z-Image pipeline (tiny Qwen3 text encoder, transformer, 16-channel VAE) for "
        "exercising the pipeline; its images are noise.",
        type="main",
        format="diffusers",
        filename="demo-zimage",
        build=_build_demo,
    ),
    DemoModel(
        name="demo-zimage-gguf",
        description="Random-weight Z-Image transformer in the original names, quantized to GGUF Q8_0, for "
        "exercising GGUF loading (paired with demo-zimage's text encoder and VAE); its images are noise.",
        type="transformer",
        format="gguf",
        filename="demo-zimage-gguf.gguf",
        build=_build_demo_gguf,
    ),
)

FAMILY = Family(
    name=NAME,
    title="Z-Image",
    pipeline_classes=PIPELINE_CLASSES,
    components=("text_encoder", "tokenizer", "transformer", "vae", "scheduler"),
    module_components=("text_encoder", "transformer", "vae"),
    constants=c.CONSTANTS,
    operations={
        "text_encoder": "text_encoder",
        "transformer": "transformer",
        "vae_decode": "vae",
        "vae_encode": "vae",
    },
    estimators=estimators.ESTIMATORS,
    runs=runs.RUNS,
    scheduler_names=SCHEDULER_NAMES,
    make_scheduler=make_scheduler,
    node_module="invokeai.app.nodes.zimage",
    # InvokeAI's node types: a loader whose outputs feed the other nodes.
    graph=GraphFacts(
        loader="z_image_model_loader",
        loader_links={
            "text_encoder": (("qwen3_encoder", "qwen3_encoder"),),
            "denoise": (("transformer", "transformer"),),
            "decode": (("vae", "vae"),),
            "encode": (("vae", "vae"),),
        },
        text_encoder="z_image_text_encoder",
        denoise="z_image_denoise",
        decode="z_image_l2i",
        encode="z_image_i2l",
        guidance_field="guidance_scale",
        guidance_label="Guidance scale",
        strength_field="denoising_start",
        pipeline_guidance_offset=-1.0,
    ),
    config_variants=CONFIG_VARIANTS,
    files=FILES,
    demos=DEMOS,
    folder_check=folder_check,
    checked_configs=("transformer", "vae", "text_encoder", "scheduler"),
    invokeai=InvokeAIFacts(base="z-image", describe=records.describe),
)
