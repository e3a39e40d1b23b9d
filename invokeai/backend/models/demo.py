"""Tiny random-weight demo models, so the first generation on a fresh machine needs no download.

Each is the real diffusers/transformers architecture with a small config and seeded random weights: the images are
noise-like, but every code path of a real model of the family runs. Builds are deterministic (same bytes every time)
and atomic: everything is built in a hidden folder next to the destination and renamed into place, so a crash
leaves no half-built model under a model's name.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SD1_NAME = "demo-sd1"
KREA2_NAME = "demo-krea2"
KREA2_GGUF_NAME = "demo-krea2-gguf"
DEMO_NAMES = (SD1_NAME, KREA2_NAME, KREA2_GGUF_NAME)
_BUILD_PREFIX = ".demo-build-"

SEED = 20240601

# Tiny architectures. Widths are multiples of 32 where a Linear's input feeds GGUF Q8_0 blocks.
SD1_UNET = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    layers_per_block=2,
    block_out_channels=(32, 64),
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=32,
    attention_head_dim=4,
    norm_num_groups=32,
)
SD1_VAE = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    layers_per_block=1,
    norm_num_groups=8,
    block_out_channels=(8, 16, 16, 16),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    sample_size=64,
)
SD1_TEXT = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=77,
    projection_dim=32,
)
SD1_SCHEDULER = dict(
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    clip_sample=False,
    set_alpha_to_one=False,
    steps_offset=1,
)

KREA2_TRANSFORMER = dict(
    in_channels=64,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    timestep_embed_dim=32,
    text_hidden_dim=32,
    num_text_layers=3,
    text_num_attention_heads=4,
    text_num_key_value_heads=2,
    text_intermediate_size=64,
    num_layerwise_text_blocks=2,
    num_refiner_text_blocks=2,
    axes_dims_rope=(4, 6, 6),
    rope_theta=1000.0,
)
KREA2_VAE = dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[])
KREA2_TEXT_LAYERS = (1, 2, 3)  # hidden_states indices the pipeline stacks; 0 is the embedding output
KREA2_SCHEDULER = dict(
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=6400,
)


@dataclass(frozen=True)
class DemoModel:
    name: str
    description: str
    family: str
    type: str
    format: str
    path: Path


_DESCRIPTIONS = {
    SD1_NAME: "Random-weight SD-1.5-style pipeline (tiny CLIP, UNet, VAE) for exercising the pipeline; "
    "its images are noise.",
    KREA2_NAME: "Random-weight Krea-2 pipeline (tiny Qwen3-VL text model, transformer, Qwen-Image VAE) for "
    "exercising the pipeline; its images are noise.",
    KREA2_GGUF_NAME: "Random-weight Krea-2 transformer quantized to GGUF Q8_0, for exercising GGUF loading; "
    "its images are noise.",
}


def _seeded() -> None:
    # Every component starts from the same generator state, so its weights do not depend on build order.
    torch.manual_seed(SEED)


def build_sd1_pipeline() -> Any:
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from .tiny_tokenizers import build_clip_tokenizer

    tokenizer = build_clip_tokenizer()
    text_config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SD1_TEXT,
    )
    _seeded()
    text_encoder = CLIPTextModel(text_config).eval()
    _seeded()
    unet = UNet2DConditionModel(**SD1_UNET).eval()
    _seeded()
    vae = AutoencoderKL(**SD1_VAE).eval()
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=DDIMScheduler(**SD1_SCHEDULER),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def build_krea2_transformer() -> Any:
    from diffusers import Krea2Transformer2DModel

    _seeded()
    return Krea2Transformer2DModel(**KREA2_TRANSFORMER).eval()


def build_krea2_pipeline() -> Any:
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, Krea2Pipeline
    from transformers import Qwen3VLConfig, Qwen3VLModel

    from .tiny_tokenizers import build_qwen_tokenizer

    tokenizer = build_qwen_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            hidden_size=KREA2_TRANSFORMER["text_hidden_dim"],
            intermediate_size=64,
            num_hidden_layers=max(KREA2_TEXT_LAYERS),
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=1024,
            rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[2, 1, 1], mrope_interleaved=True),
        ),
        # Never used for text-to-image, but Qwen3VLModel always builds its vision tower.
        vision_config=dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=KREA2_TRANSFORMER["text_hidden_dim"],
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            deepstack_visual_indexes=[0],
            num_position_embeddings=64,
        ),
        image_token_id=ids("<|image_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    _seeded()
    text_encoder = Qwen3VLModel._from_config(config, attn_implementation="sdpa").eval()
    _seeded()
    vae = AutoencoderKLQwenImage(**KREA2_VAE).eval()
    return Krea2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**KREA2_SCHEDULER),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=build_krea2_transformer(),
        text_encoder_select_layers=KREA2_TEXT_LAYERS,
    )


def write_krea2_gguf(transformer: torch.nn.Module, path: Path, quant_type: str = "Q8_0") -> dict[str, str]:
    from .gguf_export import linear_weight_names, write_gguf

    return write_gguf(transformer.state_dict(), path, quantize=linear_weight_names(transformer), quant_type=quant_type)


def _build_one(name: str, into: Path) -> Path:
    """Build demo model `name` under `into`; returns its path there."""
    target = demo_target(into, name)
    if name == SD1_NAME:
        build_sd1_pipeline().save_pretrained(target, safe_serialization=True)
    elif name == KREA2_NAME:
        build_krea2_pipeline().save_pretrained(target, safe_serialization=True)
    elif name == KREA2_GGUF_NAME:
        write_krea2_gguf(build_krea2_transformer(), target)
    else:
        raise ValueError(f"unknown demo model {name!r}; known: {', '.join(DEMO_NAMES)}")
    return target


# What probe_model reports for each (family, type, format).
_KINDS = {
    SD1_NAME: ("sd-1", "main", "diffusers"),
    KREA2_NAME: ("krea2", "main", "diffusers"),
    KREA2_GGUF_NAME: ("krea2", "transformer", "gguf"),
}


def demo_target(dest: Path, name: str) -> Path:
    return dest / (f"{name}.gguf" if name == KREA2_GGUF_NAME else name)


def build_demo_models(dest: Path, names: tuple[str, ...] = DEMO_NAMES) -> list[DemoModel]:
    """Build the demo models `names` in `dest`. An existing target is an error (nothing is built then): replacing
    a model that may be installed and in use is the caller's decision. One builder per `dest` at a time: a build
    clears staging folders it finds there, taking them for leftovers of a killed build."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name not in _KINDS:
            raise ValueError(f"unknown demo model {name!r}; known: {', '.join(DEMO_NAMES)}")
        if demo_target(dest, name).exists():
            raise FileExistsError(f"{demo_target(dest, name)} already exists")
    _remove_stale_builds(dest)
    # The build folder sits in dest so the final renames stay on one filesystem (atomic).
    staging = Path(tempfile.mkdtemp(prefix=_BUILD_PREFIX, dir=dest))
    models = []
    try:
        built = [(name, _build_one(name, staging)) for name in names]
        for name, path in built:
            final = demo_target(dest, name)
            os.replace(path, final)
            models.append(DemoModel(name, _DESCRIPTIONS[name], *_KINDS[name], final))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return models


def _remove_stale_builds(dest: Path) -> None:
    """Staging folders left by a build that was killed: never a model, safe to drop."""
    for leftover in dest.glob(f"{_BUILD_PREFIX}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
