"""The FLUX.1 family descriptor: diffusers FluxPipeline folders, single-file transformers in the Black Forest Labs
names (safetensors, and GGUF in the common converters' layout), the VAE alone as Black Forest Labs ship it
(ae.safetensors, original names), the demo models, the estimators and the nodes.

Imports no diffusers or transformers at import time (the server imports every descriptor at startup).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.families.family import Constants, DemoModel, Family, FileRule, GraphFacts, InvokeAIFacts
from invokeai.backend.families.flux import constants as c
from invokeai.backend.families.flux import estimators, layout, records, runs
from invokeai.backend.models.config_variants import ConfigVariant

NAME = "flux"
PIPELINE_CLASS = "FluxPipeline"
CONFIGS = Path(__file__).parent / "configs"
SCHEDULER_NAMES = ("euler",)

CONFIG_VARIANTS = (
    ConfigVariant(
        "flux",
        NAME,
        "FLUX.1 [dev] transformer (19 double + 38 single blocks, hidden 3072, guidance embedding)",
        CONFIGS / "flux",
    ),
    ConfigVariant(
        "flux-schnell",
        NAME,
        "FLUX.1 [schnell] transformer (19 double + 38 single blocks, hidden 3072, no guidance embedding)",
        CONFIGS / "flux-schnell",
    ),
    ConfigVariant("flux-demo", NAME, "the tiny random-weight demo-flux architecture", CONFIGS / "flux-demo"),
)


def make_scheduler(name: str, base_config: Mapping[str, Any]) -> Any:
    """FLUX.1 samples with flow-matching Euler on its own config (dev's resolution-dependent shift, schnell's fixed
    one)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from invokeai.backend.models.schedulers import new_scheduler

    if name not in SCHEDULER_NAMES:
        raise ValueError(f"unknown scheduler {name!r} for {NAME}; known: {', '.join(SCHEDULER_NAMES)}")
    return new_scheduler(FlowMatchEulerDiscreteScheduler, dict(base_config))


def folder_check(configs: Mapping[str, dict[str, Any]]) -> list[str]:
    """How a FluxPipeline folder differs from what the flux nodes run (FLUX.1 text-to-image and image-to-image:
    16-channel latents packed 2x2 into 64 transformer channels); empty: it runs. A FLUX.1 Fill or Depth transformer
    (extra conditioning channels) passes the pipeline's class check but is another model."""
    found = []
    transformer, vae = configs.get("transformer", {}), configs.get("vae", {})
    channels = vae.get("latent_channels", c.LATENT_CHANNELS)
    in_channels = transformer.get("in_channels", 64)
    if in_channels != channels * c.PATCH * c.PATCH:
        found.append(
            f"its transformer takes {in_channels} input channels; FLUX.1 text-to-image takes {channels} latent "
            f"channels packed 2x2 ({channels * c.PATCH * c.PATCH}); Fill and Depth models take more"
        )
    if transformer.get("patch_size", 1) != 1:
        found.append(f"its transformer's patch_size is {transformer['patch_size']}; FLUX.1's is 1")
    scheduler = configs.get("scheduler", {}).get("_class_name", "FlowMatchEulerDiscreteScheduler")
    if scheduler != "FlowMatchEulerDiscreteScheduler":
        found.append(f"its scheduler is {scheduler}; FLUX.1 samples with FlowMatchEulerDiscreteScheduler")
    return found


def _load_checkpoint(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return layout.load_bfl_safetensors(path, variant, dtype)


def _load_gguf(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return layout.load_bfl_gguf(path, variant, dtype)


def _load_vae(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return layout.load_original_vae(path, variant, dtype)


def _matches(names: Iterable[str]) -> bool:
    return layout.is_bfl_transformer(names)


def _matches_vae(names: Iterable[str]) -> bool:
    return layout.is_original_vae(names)


FILES = (
    FileRule(
        container="safetensors",
        format="checkpoint",
        type="transformer",
        what="FLUX.1 transformer",
        components=("transformer",),
        matches=_matches,
        signature=layout.transformer_signature,
        load=_load_checkpoint,
        canonical_name=layout.canonical_name,
    ),
    FileRule(
        container="gguf",
        format="gguf",
        type="transformer",
        what="FLUX.1 transformer",
        components=("transformer",),
        matches=_matches,
        signature=layout.transformer_signature,
        load=_load_gguf,
        canonical_name=layout.canonical_name,
    ),
    # ae.safetensors: the VAE alone in the original names (FLUX.1's downloads and Z-Image's). Its variant is the
    # first whose VAE it fits: flux and flux-schnell have the same VAE, so a full-size one is recorded as flux.
    FileRule(
        container="safetensors",
        format="checkpoint",
        type="vae",
        what="FLUX.1 VAE (ae.safetensors)",
        components=("vae",),
        matches=_matches_vae,
        signature=layout.vae_signature,
        load=_load_vae,
        refusal=layout.vae_refusal,
    ),
)


def _build_demo(path: Path) -> None:
    from invokeai.backend.families.flux import demo

    demo.build(path)


def _build_demo_gguf(path: Path) -> None:
    from invokeai.backend.families.flux import demo

    demo.build_gguf(path)


DEMOS = (
    DemoModel(
        name="demo-flux",
        description="Random-weight FLUX.1-dev-style pipeline (tiny CLIP, T5, transformer, 16-channel VAE) for "
        "exercising the pipeline; its images are noise.",
        type="main",
        format="diffusers",
        filename="demo-flux",
        build=_build_demo,
    ),
    DemoModel(
        name="demo-flux-gguf",
        description="Random-weight FLUX.1 transformer in Black Forest Labs names, quantized to GGUF Q8_0, for "
        "exercising GGUF loading (paired with demo-flux's text encoders and VAE); its images are noise.",
        type="transformer",
        format="gguf",
        filename="demo-flux-gguf.gguf",
        build=_build_demo_gguf,
    ),
)

FAMILY = Family(
    name=NAME,
    title="FLUX.1",
    pipeline_classes=(PIPELINE_CLASS,),
    components=("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "transformer", "vae", "scheduler"),
    module_components=("text_encoder", "text_encoder_2", "transformer", "vae"),
    constants=Constants(
        latent_scale=c.LATENT_SCALE,
        latent_channels=c.LATENT_CHANNELS,
        size_multiple=c.SIZE_MULTIPLE,
        text_lengths={"text_encoder": c.CLIP_TOKENS, "text_encoder_2": c.T5_TOKENS_DEV},
    ),
    operations={
        "text_encoder": "text_encoder",
        "text_encoder_2": "text_encoder_2",
        "transformer": "transformer",
        "vae_decode": "vae",
        "vae_encode": "vae",
    },
    estimators=estimators.ESTIMATORS,
    runs=runs.RUNS,
    scheduler_names=SCHEDULER_NAMES,
    make_scheduler=make_scheduler,
    node_module="invokeai.app.nodes.flux",
    graph=GraphFacts(
        # InvokeAI's FLUX.1 nodes, wired as its buildFLUXGraph wires them (the loader's VAE also goes to
        # flux_denoise's controlnet_vae, which previews steps here).
        loader="flux_model_loader",
        loader_links={
            "text_encoder": (("clip", "clip"), ("t5_encoder", "t5_encoder"), ("max_seq_len", "t5_max_seq_len")),
            "denoise": (("transformer", "transformer"), ("vae", "controlnet_vae")),
            "decode": (("vae", "vae"),),
            "encode": (("vae", "vae"),),
        },
        text_encoder="flux_text_encoder",
        denoise="flux_denoise",
        decode="flux_vae_decode",
        encode="flux_vae_encode",
        conditioning_field="positive_text_conditioning",
        negative="never",
        second_prompt_label="T5 prompt",
        steps_field="num_steps",
        guidance_field="guidance",
        guidance_label="Guidance",
        guidance_off=0.0,
        strength_field="denoising_start",
    ),
    config_variants=CONFIG_VARIANTS,
    files=FILES,
    demos=DEMOS,
    folder_check=folder_check,
    checked_configs=("transformer", "vae", "scheduler"),
    lookalikes=(
        (
            # The file rules want every marker of a whole transformer; a file with only some is not one this runs.
            "a FLUX.1 transformer (double_blocks / single_blocks) without the tensors a whole one has",
            ("double_blocks.", "model.diffusion_model.double_blocks."),
        ),
    ),
    invokeai=InvokeAIFacts(base="flux", describe=records.describe),
)
