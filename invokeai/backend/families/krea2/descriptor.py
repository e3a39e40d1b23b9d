"""Krea-2: diffusers folders, and transformers alone in GGUF paired with an installed pipeline's text encoder and
VAE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from invokeai.backend.families.family import DemoModel, Family, FileRule, GraphFacts, InvokeAIFacts
from invokeai.backend.families.krea2 import demo, estimators, layout, records, runs, scheduler
from invokeai.backend.families.krea2.constants import CONSTANTS, NAME
from invokeai.backend.models.config_variants import ConfigVariant
from invokeai.backend.models.load_gguf import load_gguf_model

CONFIGS = Path(__file__).parent / "configs"


def _load_gguf(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return load_gguf_model("Krea2Transformer2DModel", path, variant, component, dtype)


FAMILY = Family(
    name=NAME,
    title="Krea-2",
    pipeline_classes=("Krea2Pipeline",),
    components=("text_encoder", "tokenizer", "transformer", "vae", "scheduler"),
    module_components=("text_encoder", "transformer", "vae"),
    constants=CONSTANTS,
    operations={"text_encoder": "text_encoder", "transformer": "transformer", "vae_decode": "vae"},
    estimators=estimators.ESTIMATORS,
    runs=runs.RUNS,
    scheduler_names=scheduler.SCHEDULER_NAMES,
    make_scheduler=scheduler.make_scheduler,
    node_module="invokeai.app.nodes.krea2",
    # The model_index.json options Krea2Pipeline registers and reads at call time (generation.Krea2Settings), with
    # its defaults (None: the Krea 2 text encoder taps); it rewrites no component config.
    pipeline_options={"text_encoder_select_layers": None, "is_distilled": False, "patch_size": 2},
    graph=GraphFacts(
        # InvokeAI's Krea-2 nodes, wired as its buildKrea2Graph wires them (decoded by its Qwen-Image node).
        loader="krea2_model_loader",
        loader_links={
            "text_encoder": (("qwen3_vl_encoder", "qwen3_vl_encoder"),),
            "denoise": (("transformer", "transformer"),),
            "decode": (("vae", "vae"),),
        },
        text_encoder="krea2_text_encoder",
        denoise="krea2_denoise",
        decode="qwen_image_l2i",
        # InvokeAI's cfg_scale (1: none) against Krea2Pipeline's guidance_scale (0: none).
        pipeline_guidance_offset=-1.0,
    ),
    config_variants=(
        ConfigVariant(
            "krea2",
            NAME,
            "Krea-2 transformer (28 blocks, hidden 6144), Qwen-Image VAE; no text encoder",
            CONFIGS / "krea2",
        ),
        ConfigVariant("krea2-demo", NAME, "the tiny random-weight demo-krea2 architecture", CONFIGS / "krea2-demo"),
    ),
    files=(
        FileRule(
            container="gguf",
            format="gguf",
            type="transformer",
            what="Krea-2 transformer",
            components=("transformer",),
            matches=layout.is_transformer,
            signature=layout.transformer_signature,
            load=_load_gguf,
            canonical_name=layout.diffusers_name,
        ),
    ),
    demos=(
        DemoModel(
            name="demo-krea2",
            description="Random-weight Krea-2 pipeline (tiny Qwen3-VL text model, transformer, Qwen-Image VAE) for "
            "exercising the pipeline; its images are noise.",
            type="main",
            format="diffusers",
            filename="demo-krea2",
            build=demo.build,
        ),
        DemoModel(
            name="demo-krea2-gguf",
            description="Random-weight Krea-2 transformer quantized to GGUF Q8_0, for exercising GGUF loading; its "
            "images are noise.",
            type="transformer",
            format="gguf",
            filename="demo-krea2-gguf.gguf",
            build=demo.build_gguf,
        ),
    ),
    # InvokeAI 6.14.2's BaseModelType has Krea 2 (taxonomy.py: Krea2 = "krea-2").
    invokeai=InvokeAIFacts(base="krea-2", describe=records.describe),
)
