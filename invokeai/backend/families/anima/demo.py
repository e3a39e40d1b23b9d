"""demo-anima: a tiny random-weight Anima pipeline folder (the real Qwen3Model with grouped-query attention,
AnimaTextConditioner, CosmosTransformer3DModel and AutoencoderKLQwenImage classes, small configs), so a fresh server
runs the family without a download. Its images are noise.

The folder is what diffusers' AnimaModularPipeline loads (`AnimaAutoBlocks().init_pipeline(folder)` and
`load_components`): one subfolder per component and a model_index.json naming each component's library and class.
Builds are deterministic: every component starts from the same seeded generator state.

The transformer sets `concat_padding_mask` false where Anima's own config sets it true: diffusers resizes that
(all-zero) mask with torchvision, which this server does not install, so the stock pipeline could not run the demo
to compare against. The server's generation runs both settings (generation.padding_mask_resize).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from invokeai.backend.families.anima.constants import CONDITIONING_TOKENS, MAX_SEQUENCE_LENGTH
from invokeai.backend.models.demo_weights import seeded

NAME = "demo-anima"

# Qwen3-0.6B's shape at a tiny width: 4 query heads sharing 2 key-value heads (16 / 8 at full size).
TEXT_ENCODER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=2048,
    rope_theta=1e6,
    tie_word_embeddings=True,
)
# The adapter: learned T5-token queries attend to the Qwen3 states (source_dim: the text encoder's width) and come
# out as wide as the transformer's text_embed_dim, padded to the 512 tokens the DiT cross-attends to.
TEXT_CONDITIONER = dict(
    source_dim=32,
    target_dim=32,
    model_dim=32,
    num_layers=2,
    num_attention_heads=2,
    min_sequence_length=CONDITIONING_TOKENS,
)
# Cosmos-Predict2's DiT (28 blocks, 16 heads of 128, adaLN-LoRA 256 at full size), image rope scaling as Anima's.
TRANSFORMER = dict(
    in_channels=16,
    out_channels=16,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    text_embed_dim=32,
    adaln_lora_dim=8,
    max_size=(128, 240, 240),
    patch_size=(1, 2, 2),
    rope_scale=(1.0, 4.0, 4.0),
    concat_padding_mask=False,
    extra_pos_embed_type=None,
)
VAE = dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[])
# Anima's schedule: flow-matching Euler at a fixed shift of 3 (ComfyUI's sampling settings for the model).
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
# What model_index.json names for each component: the classes AnimaModularPipeline's blocks expect.
COMPONENTS = {
    "text_encoder": ("transformers", "Qwen3Model"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "t5_tokenizer": ("transformers", "T5TokenizerFast"),
    "text_conditioner": ("diffusers", "AnimaTextConditioner"),
    "transformer": ("diffusers", "CosmosTransformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLQwenImage"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
}

_QWEN_WORDS = "a an the of in on photo picture cat dog red blue green house tree sky painting portrait girl"


def build_tokenizers() -> tuple[Any, Any]:
    """(Qwen2 BPE, T5 Unigram): the tokenizers of the Qwen3 states and of the adapter's queries."""
    from invokeai.backend.models.tiny_tokenizers import build_qwen2_tokenizer, build_t5_tokenizer

    return build_qwen2_tokenizer(_QWEN_WORDS, "", 4 * MAX_SEQUENCE_LENGTH), build_t5_tokenizer(MAX_SEQUENCE_LENGTH)


def build_text_encoder(tokenizer: Any) -> Any:
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **TEXT_ENCODER)
    seeded()
    return Qwen3Model._from_config(config, attn_implementation="sdpa").eval()


def build_text_conditioner(t5_tokenizer: Any, **overrides: Any) -> Any:
    from diffusers import AnimaTextConditioner

    seeded()
    return AnimaTextConditioner(target_vocab_size=len(t5_tokenizer), **{**TEXT_CONDITIONER, **overrides}).eval()


def build_transformer(**overrides: Any) -> Any:
    from diffusers import CosmosTransformer3DModel

    seeded()
    return CosmosTransformer3DModel(**{**TRANSFORMER, **overrides}).eval()


def build_components() -> dict[str, Any]:
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler

    tokenizer, t5_tokenizer = build_tokenizers()
    text_encoder = build_text_encoder(tokenizer)
    seeded()
    vae = AutoencoderKLQwenImage(**VAE).eval()
    return {
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "t5_tokenizer": t5_tokenizer,
        "text_conditioner": build_text_conditioner(t5_tokenizer),
        "transformer": build_transformer(),
        "vae": vae,
        "scheduler": FlowMatchEulerDiscreteScheduler(**SCHEDULER),
    }


def write_folder(components: dict[str, Any], path: Path) -> None:
    """Save `components` as an Anima pipeline folder: each in its subfolder, and the model_index.json."""
    import diffusers

    path.mkdir(parents=True, exist_ok=True)
    for name, component in components.items():
        if hasattr(component, "state_dict"):
            component.save_pretrained(path / name, safe_serialization=True)
        else:
            component.save_pretrained(path / name)
    index: dict[str, Any] = {"_class_name": "AnimaModularPipeline", "_diffusers_version": diffusers.__version__}
    index |= {name: list(COMPONENTS[name]) for name in components}
    (path / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def build(path: Path) -> None:
    """Write demo-anima, an Anima pipeline folder (safetensors), to `path`."""
    write_folder(build_components(), path)
