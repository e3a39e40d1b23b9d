"""Working memory of Z-Image operations: the Qwen3 text encoder, ZImageTransformer2DModel (one denoise step, the
CFG batch included), and the AutoencoderKL's decode and encode.

Attention calls follow the diffusers/transformers code paths, read off the component's config:
- Qwen3Model (ZImagePipeline._encode_prompt): one self-attention per layer over the chat-templated prompt padded to
  `prompt_tokens` (the pipeline's max_sequence_length, 512), always with its attention mask. A padded prompt gives
  SDPA a bool (B, 1, L, L) mask and K/V repeated to the query heads (32 of 8 at 4B: transformers takes the grouped
  path only without a mask); a prompt that fills the whole length has an all-true mask, which transformers drops,
  and then runs causal with the grouped K/V (`enable_gqa`).
- ZImageTransformer2DModel: the noise refiners attend over the image tokens, (H/16)(W/16) padded to a multiple of
  32; the context refiners over the caption tokens (padded the same way); the main layers over both. Guidance runs
  the positive and negative captions as one batch of two, so every call's batch is doubled and, when the padded
  caption lengths differ, the context refiners and main layers get a (B, 1, 1, S) key mask. `prompt_tokens` is the
  longest caption in the batch (None: 512, the most a caption can be); the other is taken to be the pipeline's
  default empty negative prompt (constants.EMPTY_PROMPT_TOKENS), so the mask is listed when the caption pads past
  32 tokens. Every call has the transformer's heads (n_heads of dim / n_heads; its n_kv_heads is ignored).
- AutoencoderKL: the mid block's single-head attention over the latent pixels (invokeai/backend/cache/clip_unet_vae.py).

Activation terms (B: batch; item: element size; f32: 4 bytes for what runs in fp32 whatever the dtype; D, I: text
hidden and MLP widths; W: q heads x head_dim; L: text tokens; for the transformer W: its width, F = int(W / 3 x 8)
its feed-forward width, d: head dim):
- text encoder: B x L x ((layers + 1) D item + max(attention, MLP)) + B x L^2 x (1 + item) when padded: every hidden
  state is returned (the pipeline reads the second-to-last), the bool mask and SDPA's additive copy of it; attention
  2 D item + D f32 + 8 W item (residual, fp32 RMSNorm, q, repeated k/v, rotary temporaries, output), MLP
  2 D item + D f32 + 4 I item (gate, up, activation, product).
- transformer: B x S x (4 W + 4 F) item + the rotary tables (complex64, 4 d bytes per token, three of them) for the
  main layers over S = image + caption tokens: the image and caption sequences kept beside the unified one, the
  block's input (the caller still holds it) and its output after the attention, the normalised feed-forward input,
  and the SwiGLU's w1 and w3 outputs, the SiLU and the product (the feed-forward outweighs the attention's q, k, v,
  rotated copies and output).
- VAE decode and encode: the AutoencoderKL walk (invokeai/backend/cache/clip_unet_vae.py).
The factors scale the structural bytes to what `scripts/calibrate_working_memory.py` measured on CPU, so the
estimate lies within 1.0-1.3 of the measurement. Calibration figures: docs/families.md, "Calibration".
"""

from __future__ import annotations

from invokeai.backend.cache import clip_unet_vae
from invokeai.backend.cache.estimate import (
    AttentionCall,
    CallFacts,
    ConfigLike,
    WorkingMemory,
    config_dict,
    fp32_bytes,
)
from invokeai.backend.families.zimage.constants import (
    EMPTY_PROMPT_TOKENS,
    LATENT_SCALE,
    PATCH,
    TEXT_TOKENS,
    padded,
)

ROTARY_BYTES = 8  # a complex64 rotary factor per pair of head channels, whatever the dtype
ACTIVATION_FACTOR = {
    "text_encoder": 1.0,
    "transformer": 1.12,
    # The AutoencoderKL walk carries its own calibration (clip_unet_vae.VAE_FACTOR), as for FLUX.1's VAE.
    "vae_decode": 1.0,
    "vae_encode": 1.0,
}


def _scaled(operation: str, structural_bytes: float) -> int:
    return int(ACTIVATION_FACTOR[operation] * structural_bytes)


# --- text encoder -------------------------------------------------------------------------------------------


def text_encoder(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    tokens = facts.prompt_tokens or TEXT_TOKENS
    hidden, inner, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    width = heads * head_dim
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    attention = 2 * hidden * item + hidden * f32 + 8 * width * item
    mlp = 2 * hidden * item + hidden * f32 + 4 * inner * item
    kept = (layers + 1) * hidden * item  # output_hidden_states: the pipeline reads hidden_states[-2]
    per_sequence = tokens * (kept + max(attention, mlp))
    if facts.text_padded:
        per_sequence += tokens * tokens * (1 + item)  # the bool mask and SDPA's additive copy of it
    activation = _scaled("text_encoder", facts.batch * per_sequence)
    kv_heads = c.get("num_key_value_heads", heads)
    call = AttentionCall(
        num_heads=facts.batch * heads,
        query_len=tokens,
        key_len=tokens,
        head_dim=head_dim,
        kv_heads=None if facts.text_padded or head_dim > 256 or kv_heads == heads else facts.batch * kv_heads,
        has_attn_mask=facts.text_padded,
        is_causal=not facts.text_padded,
        count=layers,
        batch=facts.batch,
    )
    return WorkingMemory(activation, [call])


# --- transformer --------------------------------------------------------------------------------------------


def image_tokens(facts: CallFacts) -> int:
    side = LATENT_SCALE * PATCH
    return (facts.height // side) * (facts.width // side)


def caption_tokens(facts: CallFacts) -> int:
    """The longest caption of the call, in tokens (before the transformer's padding)."""
    return facts.prompt_tokens or TEXT_TOKENS


def cfg_masked(facts: CallFacts) -> bool:
    """Whether a guided call's captions pad to different lengths (the positive against the empty negative)."""
    return facts.guidance and padded(caption_tokens(facts)) != padded(EMPTY_PROMPT_TOKENS)


def transformer(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    width, heads = c["dim"], c["n_heads"]
    head_dim = width // heads
    feed_forward = int(width / 3 * 8)
    batch = facts.batch * (2 if facts.guidance else 1)
    image = padded(image_tokens(facts))
    caption = padded(caption_tokens(facts))
    tokens = image + caption
    item = facts.dtype.itemsize
    per_token = (4 * width + 4 * feed_forward) * item + 3 * ROTARY_BYTES * head_dim // 2
    activation = _scaled("transformer", batch * tokens * per_token)
    masked = cfg_masked(facts)

    def call(length: int, count: int, mask: bool) -> AttentionCall:
        return AttentionCall(
            num_heads=batch * heads,
            query_len=length,
            key_len=length,
            head_dim=head_dim,
            has_attn_mask=mask,
            count=count,
        )

    refiners = c["n_refiner_layers"]
    calls = [call(image, refiners, False), call(caption, refiners, masked), call(tokens, c["n_layers"], masked)]
    return WorkingMemory(activation, [entry for entry in calls if entry.count > 0])


# --- VAE ----------------------------------------------------------------------------------------------------


def _rescaled(memory: WorkingMemory, operation: str) -> WorkingMemory:
    return WorkingMemory(_scaled(operation, memory.activation_bytes), memory.attention_calls)


def vae_decode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return _rescaled(clip_unet_vae.vae_decode(config, facts), "vae_decode")


def vae_encode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return _rescaled(clip_unet_vae.vae_encode(config, facts), "vae_encode")


ESTIMATORS = {
    "text_encoder": text_encoder,
    "transformer": transformer,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
