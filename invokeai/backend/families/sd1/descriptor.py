"""Stable Diffusion 1.x (SD-1.5 and its fine-tunes): diffusers folders and original-layout single files."""

from __future__ import annotations

from pathlib import Path

from invokeai.backend.families.family import DemoModel, Family, FileRule, GraphFacts, InvokeAIFacts
from invokeai.backend.families.sd1 import demo, estimators, layout, legacy, load_checkpoint, runs
from invokeai.backend.families.sd1.constants import CONSTANTS, NAME
from invokeai.backend.families.sd_records import sd_describer
from invokeai.backend.families.sd_schedulers import SD_SCHEDULER_NAMES, make_sd_scheduler
from invokeai.backend.models.config_variants import ConfigVariant

CONFIGS = Path(__file__).parent / "configs"
COMPONENTS = ("text_encoder", "tokenizer", "unet", "vae", "scheduler")

FAMILY = Family(
    name=NAME,
    title="Stable Diffusion 1.x",
    pipeline_classes=("StableDiffusionPipeline",),
    components=COMPONENTS,
    module_components=("text_encoder", "unet", "vae"),
    constants=CONSTANTS,
    operations={"text_encoder": "text_encoder", "unet": "unet", "vae_decode": "vae", "vae_encode": "vae"},
    estimators=estimators.ESTIMATORS,
    runs=runs.RUNS,
    scheduler_names=SD_SCHEDULER_NAMES,
    make_scheduler=make_sd_scheduler,
    node_module="invokeai.app.nodes.sd1",
    graph=GraphFacts(
        text_encoder="sd_text_encoder", denoise="sd_denoise", decode="sd_vae_decode", encode="sd_vae_encode"
    ),
    config_variants=(
        ConfigVariant(
            "sd-1",
            NAME,
            "Stable Diffusion 1.x (CLIP ViT-L/14, 860M UNet, f8 VAE) with the real CLIP tokenizer",
            CONFIGS / "sd-1",
        ),
        ConfigVariant("sd-1-demo", NAME, "the tiny random-weight demo-sd1 architecture", CONFIGS / "sd-1-demo"),
    ),
    files=(
        FileRule(
            container="safetensors",
            format="checkpoint",
            type="main",
            what="SD-1 checkpoint",
            components=COMPONENTS,
            matches=layout.is_checkpoint,
            signature=layout.checkpoint_signature,
            load=load_checkpoint.load_sd1_checkpoint_component,
        ),
    ),
    demos=(
        DemoModel(
            name="demo-sd1",
            description="Random-weight SD-1.5-style pipeline (tiny CLIP, UNet, VAE) for exercising the pipeline; "
            "its images are noise.",
            type="main",
            format="diffusers",
            filename="demo-sd1",
            build=demo.build,
        ),
    ),
    folder_check=layout.folder_differences,
    checked_configs=("unet", "scheduler", "text_encoder"),
    # StableDiffusionPipeline.__init__'s corrections of old configs (legacy.py); it reads no model_index.json flag
    # at call time (requires_safety_checker concerns the safety checker, which the server does not run).
    config_rewrites=legacy.REWRITES,
    invokeai=InvokeAIFacts(base="sd-1", describe=sd_describer(512)),
)
