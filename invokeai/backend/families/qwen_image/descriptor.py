"""The Qwen-Image family descriptor: diffusers QwenImagePipeline folders (text-to-image, and image-to-image as
QwenImageImg2ImgPipeline), Qwen-Image-Edit's (QwenImageEditPipeline, QwenImageEditPlusPipeline: reference images),
the transformer alone as ComfyUI's diffusion model file (bf16 or fp8) and as GGUF, the demo models, the estimators
and InvokeAI's qwen_image_* nodes.

Imports no diffusers or transformers at import time (the server imports every descriptor at startup).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.families.family import DemoModel, Family, FileRule, GraphFacts, InvokeAIFacts
from invokeai.backend.families.qwen_image import component_files, estimators, layout, records, runs
from invokeai.backend.families.qwen_image import constants as c
from invokeai.backend.models.config_variants import ConfigVariant

NAME = c.NAME
PIPELINE_CLASSES = ("QwenImagePipeline", "QwenImageImg2ImgPipeline", c.EDIT_PIPELINE, c.EDIT_PLUS_PIPELINE)
CONFIGS = Path(__file__).parent / "configs"
# The class each module component must be: a folder with another (a Z-Image or FLUX.1 VAE, say) is refused at
# install, naming the class expected, rather than failing at the first image.
COMPONENT_CLASSES = {
    "transformer": "QwenImageTransformer2DModel",
    "vae": "AutoencoderKLQwenImage",
    "text_encoder": "Qwen2_5_VLForConditionalGeneration",
}
# Flow-matching Euler on the model's own schedule (the pipeline's shift mu, its exponential time shift and
# terminal), the only sampler the pipeline's schedule is defined for.
SCHEDULERS = {"euler": "FlowMatchEulerDiscreteScheduler"}
SCHEDULER_NAMES = tuple(SCHEDULERS)

CONFIG_VARIANTS = (
    ConfigVariant(
        "qwen-image",
        NAME,
        "Qwen-Image transformer (60 double-stream blocks, 24 heads of 128), Qwen2.5-VL-7B text encoder config, "
        "Qwen-Image VAE (16 channels), its scheduler; no tokenizer",
        CONFIGS / "qwen-image",
    ),
    ConfigVariant(
        "qwen-image-demo", NAME, "the tiny random-weight demo-qwen-image architecture", CONFIGS / "qwen-image-demo"
    ),
)


def make_scheduler(name: str, base_config: Mapping[str, Any]) -> Any:
    """Flow-matching Euler on the model's own scheduler config (its dynamic shifting and time shift)."""
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
    """How a QwenImagePipeline folder differs from what the qwen-image nodes run (the classes above, 2x2 packing of
    the VAE's latents, text features as wide as the transformer takes, no guidance embedding, none of the Edit
    and Layered variants' switches); empty: it runs."""
    found = []
    for component, expected in COMPONENT_CLASSES.items():
        actual = _class_of(configs.get(component, {}))
        if actual is not None and actual != expected:
            found.append(f"its {component} is {actual}; Qwen-Image's {component} is {expected}")
    if found:
        return found
    transformer, vae = configs.get("transformer", {}), configs.get("vae", {})
    text = configs.get("text_encoder", {})
    text = text.get("text_config", text)
    channels = vae.get("z_dim", c.LATENT_CHANNELS)
    in_channels = transformer.get("in_channels", c.LATENT_CHANNELS * c.PATCH**2)
    if in_channels != channels * c.PATCH**2 or transformer.get("patch_size", c.PATCH) != c.PATCH:
        found.append(
            f"its transformer takes {in_channels} channels in patches of {transformer.get('patch_size')}; the VAE's "
            f"{channels} latent channels make {channels * c.PATCH**2} in 2x2 patches"
        )
    hidden = text.get("hidden_size")
    if hidden is not None and hidden != transformer.get("joint_attention_dim", hidden):
        found.append(
            f"its text encoder's hidden states are {hidden} wide, its transformer takes "
            f"{transformer['joint_attention_dim']}"
        )
    for flag, what in (
        ("guidance_embeds", "a guidance-distilled transformer, which needs a guidance input the nodes lack"),
        ("use_additional_t_cond", "Qwen-Image-Layered's transformer"),
        ("use_layer3d_rope", "Qwen-Image-Layered's transformer"),
    ):
        if transformer.get(flag):
            found.append(f"its transformer sets {flag}: {what}")
    # Qwen-Image-Edit-2511's transformer modulates the reference tokens at timestep zero, from the image shapes the
    # Edit pipelines pass; without reference images it has nothing to do so on.
    pipeline = configs.get("model_index", {}).get("_class_name", PIPELINE_CLASSES[0])
    if transformer.get("zero_cond_t") and pipeline not in (c.EDIT_PIPELINE, c.EDIT_PLUS_PIPELINE):
        found.append(
            f"its transformer sets zero_cond_t (Qwen-Image-Edit-2511's reference conditioning) but the folder is a "
            f"{pipeline}; only {c.EDIT_PIPELINE} and {c.EDIT_PLUS_PIPELINE} folders give it reference images"
        )
    scheduler = configs.get("scheduler", {}).get("_class_name", "FlowMatchEulerDiscreteScheduler")
    if scheduler != "FlowMatchEulerDiscreteScheduler":
        found.append(f"its scheduler is {scheduler}; Qwen-Image samples with FlowMatchEulerDiscreteScheduler")
    return found


def _load_checkpoint(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return layout.load_safetensors(path, variant, dtype)


def _load_gguf(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return layout.load_gguf(path, variant, dtype)


def _load_text_encoder(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return component_files.load_text_encoder(path, variant, dtype)


def _load_vae(path: Path, variant: ConfigVariant, component: str, dtype: torch.dtype) -> Any:
    return component_files.load_vae(path, variant, dtype)


def _matches(names: Iterable[str]) -> bool:
    return layout.is_transformer(names)


def _matches_text_encoder(names: Iterable[str]) -> bool:
    return component_files.is_text_encoder(names)


def _matches_vae(names: Iterable[str]) -> bool:
    return component_files.is_vae(names)


def _text_encoder_refusal(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    return component_files.text_encoder_refusal(shapes, CONFIG_VARIANTS)


def _vae_refusal(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    return component_files.vae_refusal(shapes, CONFIG_VARIANTS)


# ComfyUI's split files: the transformer alone (diffusion_models/, bf16 or fp8; or the published GGUF files), the
# Qwen2.5-VL text encoder (text_encoders/qwen_2.5_vl_7b*.safetensors, InvokeAI's qwen_vl_encoder) and the VAE
# (vae/qwen_image_vae.safetensors). What a file lacks (the encoder's tokenizer, the transformer's scheduler) comes
# from the installed Qwen-Image pipeline whose same component has its architecture, or the loader's inputs.
TRANSFORMER_FILES = tuple(
    FileRule(
        container=container,
        format=format,
        type="transformer",
        what="Qwen-Image transformer",
        components=("transformer",),
        matches=_matches,
        signature=layout.transformer_signature,
        load=load,
        canonical_name=layout.canonical_name,
    )
    for container, format, load in (("safetensors", "checkpoint", _load_checkpoint), ("gguf", "gguf", _load_gguf))
)
FILES = (
    *TRANSFORMER_FILES,
    FileRule(
        container="safetensors",
        format="checkpoint",
        type="qwen_vl_encoder",
        what="Qwen2.5-VL text encoder (ComfyUI's qwen_2.5_vl_7b.safetensors)",
        components=("text_encoder",),
        matches=_matches_text_encoder,
        signature=component_files.text_encoder_signature,
        load=_load_text_encoder,
        canonical_name=component_files.text_encoder_name,
        refusal=_text_encoder_refusal,
    ),
    FileRule(
        container="safetensors",
        format="checkpoint",
        type="vae",
        what="Qwen-Image VAE (ComfyUI's qwen_image_vae.safetensors)",
        components=("vae",),
        matches=_matches_vae,
        signature=component_files.vae_signature,
        load=_load_vae,
        refusal=_vae_refusal,
    ),
)


def _build_demo(path: Path) -> None:
    from invokeai.backend.families.qwen_image import demo

    demo.build(path)


def _build_demo_edit(path: Path) -> None:
    from invokeai.backend.families.qwen_image import demo

    demo.build_edit(path)


def _build_demo_gguf(path: Path) -> None:
    from invokeai.backend.families.qwen_image import demo

    demo.build_gguf(path)


DEMOS = (
    DemoModel(
        name="demo-qwen-image",
        description="Random-weight Qwen-Image pipeline (tiny Qwen2.5-VL text encoder, double-stream transformer, "
        "16-channel causal VAE) for exercising the pipeline; its images are noise.",
        type="main",
        format="diffusers",
        filename="demo-qwen-image",
        build=_build_demo,
    ),
    DemoModel(
        name="demo-qwen-image-gguf",
        description="Random-weight Qwen-Image transformer quantized to GGUF Q8_0 in the published layout, for "
        "exercising GGUF loading (paired with demo-qwen-image's text encoder and VAE); its images are noise.",
        type="transformer",
        format="gguf",
        filename="demo-qwen-image-gguf.gguf",
        build=_build_demo_gguf,
    ),
    DemoModel(
        name="demo-qwen-image-edit",
        description="Random-weight Qwen-Image-Edit pipeline (QwenImageEditPipeline: a tiny Qwen2.5-VL whose vision "
        "tower sees the reference image, its Qwen2-VL processor, the transformer, the causal VAE) for exercising "
        "editing with reference images; its images are noise.",
        type="main",
        format="diffusers",
        filename="demo-qwen-image-edit",
        build=_build_demo_edit,
    ),
)

FAMILY = Family(
    name=NAME,
    title="Qwen-Image",
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
    node_module="invokeai.app.nodes.qwen_image",
    # InvokeAI's node types: a loader whose outputs feed the other nodes. Its cfg_scale is the pipeline's
    # true_cfg_scale (1 or less: no guidance).
    graph=GraphFacts(
        loader="qwen_image_model_loader",
        loader_links={
            "text_encoder": (("qwen_vl_encoder", "qwen_vl_encoder"),),
            "denoise": (("transformer", "transformer"),),
            "decode": (("vae", "vae"),),
            "encode": (("vae", "vae"),),
        },
        text_encoder="qwen_image_text_encoder",
        denoise="qwen_image_denoise",
        decode="qwen_image_l2i",
        encode="qwen_image_i2l",
        strength_field="denoising_start",
        pipeline_guidance_argument="true_cfg_scale",
    ),
    config_variants=CONFIG_VARIANTS,
    files=FILES,
    demos=DEMOS,
    folder_check=folder_check,
    # The pipeline class the folder names: Edit and Edit-Plus encode reference images each their own way.
    pipeline_options={"_class_name": PIPELINE_CLASSES[0]},
    checked_configs=("transformer", "vae", "text_encoder", "scheduler"),
    # InvokeAI 6.14.2's BaseModelType has Qwen-Image (taxonomy.py: QwenImage = "qwen-image").
    invokeai=InvokeAIFacts(base="qwen-image", describe=records.describe),
)
