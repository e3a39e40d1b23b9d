"""The Anima family descriptor: Anima pipeline folders (diffusers' AnimaModularPipeline components), its diffusion
model as the single file ComfyUI loads (the DiT with its LLM adapter), its Qwen3-0.6B text encoder as ComfyUI's
single file, the demo model, the estimators and InvokeAI's anima_* nodes. Its VAE is the Qwen-Image VAE: ComfyUI's
qwen_image_vae.safetensors installs as that family's VAE, which anima_model_loader's vae_model takes.

Imports no diffusers or transformers at import time (the server imports every descriptor at startup).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.families.anima import constants as c
from invokeai.backend.families.anima import estimators, layout, records, runs
from invokeai.backend.families.family import DemoModel, Family, FileRule, GraphFacts, InvokeAIFacts
from invokeai.backend.models import qwen3_encoder_file
from invokeai.backend.models.config_variants import ConfigVariant

NAME = c.NAME
# diffusers has no monolithic Anima pipeline: its modular AnimaModularPipeline loads a folder whose model_index.json
# names it (and every component's library and class).
PIPELINE_CLASSES = ("AnimaModularPipeline",)
CONFIGS = Path(__file__).parent / "configs"
# The class each module component must be: a folder with another (a Z-Image transformer, a FLUX.1 VAE) is refused at
# install, naming the class expected, rather than failing at the first image.
COMPONENT_CLASSES = {
    "transformer": "CosmosTransformer3DModel",
    "text_conditioner": "AnimaTextConditioner",
    "vae": "AutoencoderKLQwenImage",
    "text_encoder": "Qwen3Model",
}
# Flow-matching samplers that take the pipeline's sigmas on the model's own config: Euler, the pipeline's, and LCM
# (its step re-noises the clean estimate, with noise from the seed's generator). Both are in InvokeAI's list.
SCHEDULERS = {"euler": "FlowMatchEulerDiscreteScheduler", "lcm": "FlowMatchLCMScheduler"}
SCHEDULER_NAMES = tuple(SCHEDULERS)

CONFIG_VARIANTS = (
    ConfigVariant(
        "anima",
        NAME,
        "Anima: Cosmos-Predict2-2B DiT (28 blocks, 16 heads of 128), 6-block LLM adapter, Qwen3-0.6B text encoder "
        "config, Qwen-Image VAE (16 channels), flow-matching Euler at shift 3; no tokenizers",
        CONFIGS / "anima",
    ),
    ConfigVariant("anima-demo", NAME, "the tiny random-weight demo-anima architecture", CONFIGS / "anima-demo"),
)


def make_scheduler(name: str, base_config: Mapping[str, Any]) -> Any:
    """A flow-matching sampler on the model's own scheduler config (its shift)."""
    import diffusers

    from invokeai.backend.models.schedulers import new_scheduler

    if name not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {name!r} for {NAME}; known: {', '.join(SCHEDULER_NAMES)}")
    return new_scheduler(getattr(diffusers, SCHEDULERS[name]), dict(base_config))


def _class_of(config: Mapping[str, Any]) -> str | None:
    """A component config's class: diffusers writes `_class_name`, transformers `architectures`."""
    if "_class_name" in config:
        return str(config["_class_name"])
    architectures = config.get("architectures")
    return str(architectures[0]) if isinstance(architectures, list) and architectures else None


def folder_check(configs: Mapping[str, dict[str, Any]]) -> list[str]:
    """How an Anima folder differs from what the anima nodes run (the classes above, the adapter's output as wide as
    the DiT's text input and its input as wide as the text encoder's states, the VAE's 16 latent channels the DiT's
    input, flow-matching Euler); empty: it runs."""
    found = []
    for component, expected in COMPONENT_CLASSES.items():
        actual = _class_of(configs.get(component, {}))
        if actual is not None and actual != expected:
            found.append(f"its {component} is {actual}; Anima's {component} is {expected}")
    if found:
        return found
    transformer, conditioner = configs.get("transformer", {}), configs.get("text_conditioner", {})
    vae, text = configs.get("vae", {}), configs.get("text_encoder", {})
    channels = vae.get("z_dim", c.LATENT_CHANNELS)
    if transformer.get("in_channels", c.LATENT_CHANNELS) != channels:
        found.append(f"its transformer takes {transformer.get('in_channels')} channels, its VAE makes {channels}")
    if conditioner.get("target_dim", 1024) != transformer.get("text_embed_dim", 1024):
        found.append(
            f"its text conditioner makes {conditioner.get('target_dim')}-wide conditioning, its transformer takes "
            f"{transformer.get('text_embed_dim')}"
        )
    if text.get("hidden_size") is not None and text["hidden_size"] != conditioner.get("source_dim", 1024):
        found.append(
            f"its text encoder's states are {text['hidden_size']} wide, its text conditioner takes "
            f"{conditioner.get('source_dim')}"
        )
    if list(transformer.get("patch_size", [1, 2, 2])) != [1, c.PATCH, c.PATCH]:
        found.append(f"its transformer patches {transformer.get('patch_size')}; Anima's patches 1 x 2 x 2")
    for key, what in (("img_context_dim_in", "image context"), ("controlnet_block_every_n", "control residuals")):
        if transformer.get(key):
            found.append(f"its transformer takes {what} ({key}), which the nodes do not provide")
    scheduler = configs.get("scheduler", {}).get("_class_name", "FlowMatchEulerDiscreteScheduler")
    if scheduler != "FlowMatchEulerDiscreteScheduler":
        found.append(f"its scheduler is {scheduler}; Anima samples with FlowMatchEulerDiscreteScheduler")
    return found


def _load_diffusion_model(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return layout.load(path, variant, component, dtype)


def _load_text_encoder(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return qwen3_encoder_file.load_text_encoder(path, variant, dtype)


def _matches(names: Iterable[str]) -> bool:
    return layout.is_transformer(names)


def _matches_text_encoder(names: Iterable[str]) -> bool:
    return qwen3_encoder_file.is_text_encoder(names)


def _text_encoder_refusal(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    return qwen3_encoder_file.text_encoder_refusal(
        shapes, CONFIG_VARIANTS, "Anima", "Qwen3-0.6B (ComfyUI's qwen_3_06b_base.safetensors)"
    )


# ComfyUI's split files: the diffusion model (diffusion_models/anima-*.safetensors: the DiT and the LLM adapter, a
# `transformer` record giving both), the Qwen3 text encoder (text_encoders/qwen_3_06b_base.safetensors, InvokeAI's
# qwen3_encoder; Z-Image's rule takes Qwen3-4B files, this one Qwen3-0.6B's) and the VAE (vae/qwen_image_vae.
# safetensors: the Qwen-Image family's file). What a file lacks (the tokenizers, the scheduler) comes from the
# installed Anima pipeline whose same components have its architecture, or the loader's inputs.
FILES = (
    FileRule(
        container="safetensors",
        format="checkpoint",
        type="transformer",
        what="Anima diffusion model (ComfyUI's anima-*.safetensors: DiT and LLM adapter)",
        components=("transformer", "text_conditioner"),
        matches=_matches,
        signature=layout.transformer_signature,
        load=_load_diffusion_model,
        canonical_name=layout.canonical_name,
    ),
    FileRule(
        container="safetensors",
        format="checkpoint",
        type="qwen3_encoder",
        what="Qwen3 text encoder (ComfyUI's qwen_3_06b_base.safetensors)",
        components=("text_encoder",),
        matches=_matches_text_encoder,
        signature=qwen3_encoder_file.text_encoder_signature,
        load=_load_text_encoder,
        canonical_name=qwen3_encoder_file.text_encoder_name,
        refusal=_text_encoder_refusal,
    ),
)


# A Cosmos-Predict2 DiT without the LLM adapter (Cosmos Predict2 itself, or an Anima DiT saved without it) has
# Anima's block names but nothing to condition it with the Qwen3 states: the probe's refusal says what it is.
LOOKALIKES = (
    (
        "a Cosmos-Predict2 DiT without Anima's LLM adapter (no llm_adapter.* tensors)",
        tuple(f"{prefix}blocks.0.adaln_modulation_cross_attn." for prefix in (*layout.PREFIXES, "")),
    ),
)


def _build_demo(path: Path) -> None:
    from invokeai.backend.families.anima import demo

    demo.build(path)


DEMOS = (
    DemoModel(
        name="demo-anima",
        description="Random-weight Anima pipeline (tiny Qwen3 text encoder, LLM adapter, Cosmos DiT, 16-channel "
        "causal VAE) for exercising the pipeline; its images are noise.",
        type="main",
        format="diffusers",
        filename="demo-anima",
        build=_build_demo,
    ),
)

FAMILY = Family(
    name=NAME,
    title="Anima",
    pipeline_classes=PIPELINE_CLASSES,
    components=("text_encoder", "tokenizer", "t5_tokenizer", "text_conditioner", "transformer", "vae", "scheduler"),
    module_components=("text_encoder", "text_conditioner", "transformer", "vae"),
    constants=c.CONSTANTS,
    operations={
        "text_encoder": "text_encoder",
        "text_conditioner": "text_conditioner",
        "transformer": "transformer",
        "vae_decode": "vae",
        "vae_encode": "vae",
    },
    estimators=estimators.ESTIMATORS,
    runs=runs.RUNS,
    scheduler_names=SCHEDULER_NAMES,
    make_scheduler=make_scheduler,
    node_module="invokeai.app.nodes.anima",
    # InvokeAI's node types: a loader whose outputs feed the other nodes; guidance_scale is classifier-free
    # guidance's own (1: none), as the pipeline's guider takes it.
    graph=GraphFacts(
        loader="anima_model_loader",
        loader_links={
            "text_encoder": (("qwen3_encoder", "qwen3_encoder"),),
            "denoise": (("transformer", "transformer"),),
            "decode": (("vae", "vae"),),
            "encode": (("vae", "vae"),),
        },
        text_encoder="anima_text_encoder",
        denoise="anima_denoise",
        decode="anima_l2i",
        encode="anima_i2l",
        guidance_field="guidance_scale",
        guidance_label="Guidance scale",
        strength_field="denoising_start",
    ),
    config_variants=CONFIG_VARIANTS,
    files=FILES,
    demos=DEMOS,
    folder_check=folder_check,
    lookalikes=LOOKALIKES,
    checked_configs=("transformer", "text_conditioner", "vae", "text_encoder", "scheduler"),
    # InvokeAI 6.14.2's BaseModelType has Anima (taxonomy.py: Anima = "anima").
    invokeai=InvokeAIFacts(base="anima", describe=records.describe),
)
