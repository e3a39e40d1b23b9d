"""demo-sdxl: a tiny random-weight StableDiffusionXLPipeline from the real classes, built in about a second.

Two CLIP text encoders, 32 and 64 wide (the UNet attends over their concatenation, 96), a two-level UNet
with text_time conditioning, linear projections, per-block head counts and two transformer layers in its attention
level (the SDXL features its code paths depend on), the tiny SD VAE with SDXL's scaling factor and force_upcast, and
SDXL base's Euler scheduler. Seeded per component, so the saved bytes are the same on every build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invokeai.backend.models.demo_weights import seeded

NAME = "demo-sdxl"
DESCRIPTION = (
    "Random-weight SDXL-style pipeline (two tiny CLIP encoders, text_time UNet, VAE) for exercising the pipeline; "
    "its images are noise."
)

TEXT = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77
)
# Wider than the first, as OpenCLIP bigG (1280) is than CLIP ViT-L (768): diffusers tells the two encoders of an SGM
# file apart by width, so equal widths would make the demo's single file unreadable to it. Its projection is
# narrower than its width, so a transposed text_projection cannot pass for the right one; its MLP is 4x as wide as
# bigG's is, so the MLP dominates its working memory as it does bigG's.
TEXT_2 = dict(TEXT, hidden_size=64, intermediate_size=256, projection_dim=32, hidden_act="gelu")
ADDITION_TIME_EMBED_DIM = 8
UNET = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    layers_per_block=1,
    block_out_channels=(32, 64),
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    cross_attention_dim=TEXT["hidden_size"] + TEXT_2["hidden_size"],
    attention_head_dim=(2, 4),
    transformer_layers_per_block=(1, 2),
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=ADDITION_TIME_EMBED_DIM,
    # pooled text embeddings (text_encoder_2's projection) + six time ids of addition_time_embed_dim each
    projection_class_embeddings_input_dim=TEXT_2["projection_dim"] + 6 * ADDITION_TIME_EMBED_DIM,
    norm_num_groups=32,
)
VAE = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    layers_per_block=1,
    norm_num_groups=8,
    block_out_channels=(8, 16, 16, 16),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    sample_size=64,
    scaling_factor=0.13025,
    force_upcast=True,
)
# SDXL base 1.0's scheduler_config.json.
SCHEDULER = dict(
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    clip_sample=False,
    interpolation_type="linear",
    num_train_timesteps=1000,
    prediction_type="epsilon",
    sample_max_value=1.0,
    set_alpha_to_one=False,
    skip_prk_steps=True,
    steps_offset=1,
    timestep_spacing="leading",
    trained_betas=None,
    use_karras_sigmas=False,
)
# SDXL's second tokenizer (OpenCLIP's) pads with "!" rather than the end-of-text token.
TOKENIZER_2_PAD = "!"


def build_tokenizers() -> tuple[Any, Any]:
    from invokeai.backend.models.tiny_tokenizers import build_clip_tokenizer

    tokenizer = build_clip_tokenizer()
    tokenizer_2 = build_clip_tokenizer()
    tokenizer_2.pad_token = TOKENIZER_2_PAD
    return tokenizer, tokenizer_2


def build_pipeline() -> Any:
    """The demo StableDiffusionXLPipeline, in memory (fp32, eval mode)."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    tokenizer, tokenizer_2 = build_tokenizers()

    def text_config(settings: dict[str, Any], tok: Any) -> Any:
        return CLIPTextConfig(
            vocab_size=len(tok),
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            **settings,
        )

    seeded()
    text_encoder = CLIPTextModel(text_config(TEXT, tokenizer)).eval()
    seeded()
    text_encoder_2 = CLIPTextModelWithProjection(text_config(TEXT_2, tokenizer_2)).eval()
    seeded()
    unet = UNet2DConditionModel(**UNET).eval()
    seeded()
    vae = AutoencoderKL(**VAE).eval()
    return StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=EulerDiscreteScheduler.from_config(SCHEDULER),
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
    )


def build(path: Path) -> None:
    """Write demo-sdxl as a diffusers folder (safetensors) at `path`."""
    build_pipeline().save_pretrained(Path(path), safe_serialization=True)
