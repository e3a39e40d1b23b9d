"""demo-flux: a tiny random-weight FLUX.1-dev-like pipeline (guidance embedding on) from the real classes, and the
same transformer as a GGUF file in the Black Forest Labs names the common converters write.

Builds are deterministic: every component starts from the same seeded generator state. Widths are multiples of 32
wherever a Linear's input feeds GGUF Q8_0 blocks; the rotary axes sum to the head dim, as FLUX requires.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invokeai.backend.models.demo_weights import seeded

NAME = "demo-flux"
GGUF_NAME = "demo-flux-gguf"

TRANSFORMER = dict(
    patch_size=1,
    in_channels=64,  # 16 latent channels x 2 x 2 packing
    num_layers=1,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    guidance_embeds=True,
    axes_dims_rope=(4, 6, 6),
)
VAE = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=16,
    layers_per_block=1,
    norm_num_groups=8,
    block_out_channels=(8, 16, 16, 16),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    sample_size=64,
    use_quant_conv=False,
    use_post_quant_conv=False,
    scaling_factor=0.3611,
    shift_factor=0.1159,
)
CLIP_TEXT = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=77,
    projection_dim=32,
)
T5_TEXT = dict(
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_heads=4,
    feed_forward_proj="gated-gelu",
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
)
# FLUX.1-dev's scheduler: flow-matching Euler with the resolution-dependent shift.
SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
)


def build_transformer(**overrides: Any) -> Any:
    from diffusers import FluxTransformer2DModel

    seeded()
    return FluxTransformer2DModel(**{**TRANSFORMER, **overrides}).eval()


def build_pipeline(**transformer_overrides: Any) -> Any:
    """The demo FluxPipeline; `transformer_overrides` change its transformer (`guidance_embeds=False` for a
    schnell-like one)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from invokeai.backend.models.tiny_tokenizers import build_clip_tokenizer, build_t5_tokenizer

    tokenizer = build_clip_tokenizer()
    clip_config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **CLIP_TEXT,
    )
    tokenizer_2 = build_t5_tokenizer()
    t5_config = T5Config(
        vocab_size=len(tokenizer_2),
        pad_token_id=tokenizer_2.pad_token_id,
        eos_token_id=tokenizer_2.eos_token_id,
        decoder_start_token_id=tokenizer_2.pad_token_id,
        is_encoder_decoder=False,
        use_cache=False,
        **T5_TEXT,
    )
    seeded()
    text_encoder = CLIPTextModel(clip_config).eval()
    seeded()
    text_encoder_2 = T5EncoderModel(t5_config).eval()
    seeded()
    vae = AutoencoderKL(**VAE).eval()
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=build_transformer(**transformer_overrides),
    )


def build(path: Path) -> None:
    """Write demo-flux, a diffusers folder (safetensors), to `path`."""
    build_pipeline().save_pretrained(path, safe_serialization=True)


def build_gguf(path: Path) -> None:
    """Write demo-flux-gguf: demo-flux's transformer in BFL names, Linear weights Q8_0, to `path`."""
    from invokeai.backend.families.flux.layout import write_bfl_gguf

    write_bfl_gguf(build_transformer(), path)
