"""Working memory of FLUX.1 operations: CLIP-L (pooled), T5 encoder, FluxTransformer2DModel (one step), VAE decode
and encode.

Attention calls follow the diffusers/transformers code paths, read off the component's config:
- CLIPTextModel: one causal self-attention per layer over the 77-token prompt, no mask
  (`invokeai.backend.cache.clip_unet_vae`).
- T5EncoderModel: one self-attention per layer over the padded prompt (`prompt_tokens`, FluxPipeline's
  max_sequence_length: 512 for dev, 256 for schnell), with the relative position bias (1, heads, L, L) passed to
  SDPA as an additive float mask; the pipeline passes no attention mask.
- FluxTransformer2DModel: every double block and every single block makes one joint call over text + image tokens
  (T + N; N = (H/16) x (W/16)): 4096 + 512 tokens at 1024², 24 heads of 128. No mask.
- AutoencoderKL: the mid block's single-head attention over the latent pixels (the AutoencoderKL walk: FLUX's VAE is the
  same AutoencoderKL with 16 latent channels and no quant convs, which the walk overcounts by a 1x1 conv's output).

Activation terms (B: batch; item: element size; f32: 4 bytes for what runs in fp32; W: transformer width; S = T +
N; D, I: T5 width and feed-forward width; L: T5 tokens; h: T5 heads):
- T5: the position bias, shared by the batch (h L^2 item, and SDPA's contiguous mask copy of it) with its int64
  bucket indices (2 L^2 x 8), plus per token
  B x L x max(attention: residual D, fp32 RMSNorm D, norm output D, q, k, v and output (4 h d_kv), o_proj D;
  gated feed-forward: residual, fp32 norm, norm output, wi_0 and wi_1 outputs, GELU (tanh) temporaries and their
  product, 6 I). x ACTIVATION_FACTOR, as every term.
- transformer: B x S x max(attention: both streams' residuals, norm output, q, k, v and their joint copy, fp32
  rotary temporaries for q and k, output; feed-forward: residual, norm output, the 4 W projection and its GELU,
  output) per token.
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
from invokeai.backend.families.flux.constants import LATENT_SCALE, PATCH, T5_TOKENS_DEV

ACTIVATION_FACTOR = {
    "text_encoder_2": 1.08,
    "transformer": 1.15,
    "vae_decode": 1.0,
    "vae_encode": 1.0,
}


def _scaled(operation: str, structural_bytes: float) -> int:
    return int(ACTIVATION_FACTOR[operation] * structural_bytes)


def text_encoder(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    """CLIP-L on the padded prompt (the pooled output is read off the last hidden state)."""
    return clip_unet_vae.clip_text_encoder(config, facts)


def text_encoder_2(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    tokens = facts.prompt_tokens or T5_TOKENS_DEV
    hidden, inner, heads = c["d_model"], c["d_ff"], c["num_heads"]
    width = heads * c["d_kv"]
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    attention = 3 * hidden * item + hidden * f32 + 4 * width * item
    feed_forward = 3 * hidden * item + hidden * f32 + 6 * inner * item
    per_batch = tokens * max(attention, feed_forward)
    # The bias is computed once, for one sequence, and reused by every layer: the embedding's (L, L, heads) output,
    # the contiguous copy SDPA gets, and the int64 bucket indices beside them.
    fixed = 2 * heads * tokens * tokens * item + 2 * tokens * tokens * 8
    activation = _scaled("text_encoder_2", facts.batch * per_batch + fixed)
    call = AttentionCall(
        num_heads=facts.batch * heads,
        query_len=tokens,
        key_len=tokens,
        head_dim=c["d_kv"],
        has_attn_mask=True,
        count=c["num_layers"],
    )
    return WorkingMemory(activation, [call])


def image_tokens(facts: CallFacts) -> int:
    side = LATENT_SCALE * PATCH
    return (facts.height // side) * (facts.width // side)


def transformer(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    heads, head_dim = c["num_attention_heads"], c["attention_head_dim"]
    width = heads * head_dim
    mlp = int(width * c.get("mlp_ratio", 4.0))
    tokens = (facts.prompt_tokens or T5_TOKENS_DEV) + image_tokens(facts)
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    # Residuals of both streams, norm output, q/k/v per stream and their joint copy, output; rotary embedding
    # works in fp32 on q and k (input copy, rotated copy, two products).
    attention = 10 * width * item + 4 * width * f32
    feed_forward = 3 * width * item + 2 * mlp * item
    activation = _scaled("transformer", facts.batch * tokens * max(attention, feed_forward))
    call = AttentionCall(
        num_heads=facts.batch * heads,
        query_len=tokens,
        key_len=tokens,
        head_dim=head_dim,
        count=c["num_layers"] + c["num_single_layers"],
    )
    return WorkingMemory(activation, [call])


def _rescaled(memory: WorkingMemory, operation: str) -> WorkingMemory:
    return WorkingMemory(_scaled(operation, memory.activation_bytes), memory.attention_calls)


def vae_decode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return _rescaled(clip_unet_vae.vae_decode(config, facts), "vae_decode")


def vae_encode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return _rescaled(clip_unet_vae.vae_encode(config, facts), "vae_encode")


ESTIMATORS = {
    "text_encoder": text_encoder,
    "text_encoder_2": text_encoder_2,
    "transformer": transformer,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
