"""demo-krea2 and demo-krea2-gguf: a tiny random-weight Krea-2 pipeline (the real Qwen3-VL text model, transformer
and Qwen-Image VAE classes, small configs, grouped-query attention) and its transformer quantized to GGUF Q8_0, so a
fresh server runs both formats without a download. Their images are noise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from invokeai.backend.families.krea2.constants import NAME
from invokeai.backend.models.demo_weights import seeded

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


def build_krea2_transformer() -> Any:
    from diffusers import Krea2Transformer2DModel

    seeded()
    return Krea2Transformer2DModel(**KREA2_TRANSFORMER).eval()


def build_krea2_pipeline() -> Any:
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, Krea2Pipeline
    from transformers import Qwen3VLConfig, Qwen3VLModel

    from invokeai.backend.families.krea2.tokenizer import build_qwen_tokenizer

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
    seeded()
    text_encoder = Qwen3VLModel._from_config(config, attn_implementation="sdpa").eval()
    seeded()
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
    from invokeai.backend.models.gguf_export import linear_weight_names, write_gguf

    return write_gguf(
        transformer.state_dict(), path, quantize=linear_weight_names(transformer), arch=NAME, quant_type=quant_type
    )


def build(path: Path) -> None:
    build_krea2_pipeline().save_pretrained(path, safe_serialization=True)


def build_gguf(path: Path) -> None:
    write_krea2_gguf(build_krea2_transformer(), path)
