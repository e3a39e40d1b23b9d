"""demo-sd1: a tiny random-weight SD-1.5-style pipeline (the real CLIP, UNet and VAE classes, small configs), so a
fresh server generates without a download. Its images are noise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invokeai.backend.models.demo_weights import seeded

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


def build_sd1_pipeline(unet_config: dict[str, Any] = SD1_UNET, text_config: dict[str, Any] = SD1_TEXT) -> Any:
    """The demo pipeline; other configs give other sizes (benchmarks/against_invokeai.py builds one whose
    cross-attention and text width are SD-1's 768, which InvokeAI's probe asks for)."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from invokeai.backend.models.tiny_tokenizers import build_clip_tokenizer

    tokenizer = build_clip_tokenizer()
    clip_config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **text_config,
    )
    seeded()
    text_encoder = CLIPTextModel(clip_config).eval()
    seeded()
    unet = UNet2DConditionModel(**unet_config).eval()
    seeded()
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


def build(path: Path) -> None:
    build_sd1_pipeline().save_pretrained(path, safe_serialization=True)
