"""demo-qwen-image and demo-qwen-image-gguf: a tiny random-weight Qwen-Image pipeline (the real
Qwen2_5_VLForConditionalGeneration with grouped-query attention, QwenImageTransformer2DModel and AutoencoderKLQwenImage
classes, small configs) and its transformer quantized to GGUF Q8_0 in the published layout, so a fresh server runs
the family, and its GGUF files, without a download. Their images are noise.

Builds are deterministic: every component starts from the same seeded generator state. Linear widths are multiples
of 32 wherever a GGUF quantization block must fit; the rotary axes sum to the head dim, as the transformer requires.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from invokeai.backend.models.demo_weights import seeded

NAME = "demo-qwen-image"
GGUF_NAME = "demo-qwen-image-gguf"
EDIT_NAME = "demo-qwen-image-edit"

TRANSFORMER = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=32,  # the text encoder's hidden size
    guidance_embeds=False,
    axes_dims_rope=(4, 6, 6),
)
# Qwen2.5-VL's text model at a tiny width, 4 query heads sharing 2 key-value heads (28 / 4 at 7B); its mRoPE
# sections sum to half the head dim.
TEXT_CONFIG = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[1, 1, 2]),
)
# Never used for text-to-image, but Qwen2_5_VLForConditionalGeneration always builds its vision tower.
VISION_CONFIG = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    out_hidden_size=32,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=112,
    fullatt_block_indexes=[0],
)
# demo-qwen-image-edit's vision tower sees the reference images: two blocks, the first attending within windows of
# 112 pixels (8 x 8 patches), the second over the whole image, as Qwen2.5-VL's blocks alternate.
EDIT_VISION_CONFIG = {**VISION_CONFIG, "depth": 2, "fullatt_block_indexes": [1]}
# Its processor: Qwen2-VL's, at a small pixel budget (16 x 16 patches at most) so that a reference image costs the
# tiny text model a few dozen tokens.
EDIT_PROCESSOR = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
VAE = dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[])
# The Edit pipelines encode every reference image at about 1 MP: demo-qwen-image-edit's VAE is half as wide, which
# halves that encode (4 s instead of 8 on one CPU thread).
EDIT_VAE = {**VAE, "base_dim": 4}
# Qwen-Image's scheduler: flow-matching Euler with the resolution-dependent shift.
SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=1.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=0.9,
    base_image_seq_len=256,
    max_image_seq_len=8192,
    shift_terminal=0.02,
    time_shift_type="exponential",
)


def build_transformer(**overrides: Any) -> Any:
    from diffusers import QwenImageTransformer2DModel

    seeded()
    return QwenImageTransformer2DModel(**{**TRANSFORMER, **overrides}).eval()


def build_text_encoder(tokenizer: Any, vision_config: dict[str, Any] = VISION_CONFIG) -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=ids("<|endoftext|>"),
            eos_token_id=ids("<|im_end|>"),
            **TEXT_CONFIG,
        ),
        vision_config=vision_config,
        image_token_id=ids("<|image_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    seeded()
    return Qwen2_5_VLForConditionalGeneration._from_config(config, attn_implementation="sdpa").eval()


def build_pipeline() -> Any:
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    from invokeai.backend.families.qwen_image.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    text_encoder = build_text_encoder(tokenizer)
    seeded()
    vae = AutoencoderKLQwenImage(**VAE).eval()
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=build_transformer(),
    )


def build(path: Path) -> None:
    """Write demo-qwen-image, a diffusers folder (safetensors), to `path`."""
    build_pipeline().save_pretrained(path, safe_serialization=True)


def build_gguf(path: Path) -> None:
    """Write demo-qwen-image-gguf: demo-qwen-image's transformer quantized to Q8_0, to `path`."""
    from invokeai.backend.families.qwen_image.layout import write_gguf

    write_gguf(build_transformer(), path)


def build_edit_pipeline() -> Any:
    """A tiny QwenImageEditPipeline. Its processor is transformers' Qwen2-VL one without the video part
    (vision_processor.ImageProcessing), which saves as the stock processor's files."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from invokeai.backend.families.qwen_image.tokenizer import build_edit_tokenizer
    from invokeai.backend.families.qwen_image.vision_processor import ImageProcessing

    tokenizer = build_edit_tokenizer()
    # Saved as "Qwen2VLImageProcessor": a loader picks its backend (AutoImageProcessor: PIL without torchvision).
    image_processor = Qwen2VLImageProcessorPil(**EDIT_PROCESSOR)
    text_encoder = build_text_encoder(tokenizer, EDIT_VISION_CONFIG)
    seeded()
    vae = AutoencoderKLQwenImage(**EDIT_VAE).eval()
    return QwenImageEditPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        processor=ImageProcessing(image_processor=image_processor, tokenizer=tokenizer),
        transformer=build_transformer(),
    )


def build_edit(path: Path) -> None:
    """Write demo-qwen-image-edit, a QwenImageEditPipeline folder (safetensors), to `path`, its processor/ in the
    published layout (preprocessor_config.json beside the tokenizer's files) naming Qwen2VLProcessor."""
    import json

    pipe = build_edit_pipeline()
    pipe.save_pretrained(path, safe_serialization=True)
    processor = Path(path) / "processor"
    for stale in processor.iterdir():
        stale.unlink()
    pipe.processor.image_processor.save_pretrained(processor)
    pipe.processor.tokenizer.save_pretrained(processor)
    index_file = Path(path) / "model_index.json"
    index = json.loads(index_file.read_text(encoding="utf-8"))
    index["processor"] = ["transformers", "Qwen2VLProcessor"]
    index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
