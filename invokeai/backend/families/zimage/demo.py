"""demo-zimage and demo-zimage-gguf: a tiny random-weight Z-Image pipeline (the real Qwen3Model, transformer and
FLUX-style AutoencoderKL classes, small configs, grouped-query attention in the text encoder) and its transformer in
the original names quantized to GGUF Q8_0, so a fresh server runs both formats without a download. Their images are
noise.

Builds are deterministic: every component starts from the same seeded generator state. Widths are multiples of 32
wherever a Linear's input feeds GGUF blocks (the feed-forward width int(dim / 3 * 8) included: dim 96 gives 256);
the rotary axes sum to the head dim, as the transformer requires.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invokeai.backend.models.demo_weights import seeded

NAME = "demo-zimage"
GGUF_NAME = "demo-zimage-gguf"

TRANSFORMER = dict(
    all_patch_size=(2,),
    all_f_patch_size=(1,),
    in_channels=16,
    dim=96,
    n_layers=2,
    n_refiner_layers=2,
    n_heads=3,
    n_kv_heads=3,
    qk_norm=True,
    cap_feat_dim=32,
    rope_theta=256.0,
    t_scale=1000.0,
    axes_dims=[8, 12, 12],
    axes_lens=[1024, 512, 512],
)
TEXT_ENCODER = dict(
    hidden_size=32,  # the transformer's cap_feat_dim
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=2048,
    rope_theta=1e6,
    tie_word_embeddings=True,
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
# Z-Image-Turbo's scheduler: flow-matching Euler with a fixed shift of 3.
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)


def build_transformer(**overrides: Any) -> Any:
    from diffusers import ZImageTransformer2DModel

    seeded()
    return ZImageTransformer2DModel(**{**TRANSFORMER, **overrides}).eval()


def build_text_encoder(tokenizer: Any) -> Any:
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **TEXT_ENCODER)
    seeded()
    return Qwen3Model._from_config(config, attn_implementation="sdpa").eval()


def build_pipeline() -> Any:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline

    from invokeai.backend.families.zimage.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    text_encoder = build_text_encoder(tokenizer)
    seeded()
    vae = AutoencoderKL(**VAE).eval()
    return ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=build_transformer(),
    )


def build(path: Path) -> None:
    """Write demo-zimage, a diffusers folder (safetensors), to `path`."""
    build_pipeline().save_pretrained(path, safe_serialization=True)


def build_gguf(path: Path) -> None:
    """Write demo-zimage-gguf: demo-zimage's transformer in the original names, quantized to Q8_0, to `path`."""
    from invokeai.backend.families.zimage.layout import write_original_gguf

    write_original_gguf(build_transformer(), path)
