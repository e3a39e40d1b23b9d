"""Working memory of Anima operations: the Qwen3 text model, the LLM adapter (AnimaTextConditioner), the
Cosmos-Predict2 DiT (one call: guidance runs the positive and the negative as two batch-1 calls, one after the
other) and the Qwen-Image VAE's decode and encode.

Attention calls follow the diffusers/transformers code paths, read off the component's config:
- Qwen3 text model (generation.encode_prompt): each layer attends over the prompt's tokens (`prompt_tokens`; None:
  the most the tokenizer keeps, 512). One prompt has no padding: transformers drops the all-true mask and runs
  causal with the grouped key-value heads as they are (`enable_gqa`: 8 of 16 query heads at 0.6B). A padded batch
  (`text_padded`; a single empty prompt is one masked-out token, padded too) gets a bool (B, 1, L, L) mask and K/V
  repeated to the query heads.
- Adapter: each of its blocks runs self-attention over the T5 query tokens and cross-attention from them to the
  Qwen3 states, both with a bool key mask, as the pipeline always passes the masks (`prompt_tokens` long, both).
- DiT: each block runs self-attention over the image tokens, (H/16)(W/16) of them, and cross-attention from them to
  the adapter's 512 tokens, both unmasked, at the transformer's heads.
- VAE decode and encode: the AutoencoderKLQwenImage walks (invokeai/backend/cache/causal_vae.py).

Activation terms (B: batch; item: element size; f32: 4 bytes; per token, in widths of the component):
- text encoder: B x L x (the embedding output, the rotary tables, and the largest of a layer's phases: the
  attention's residual, normed input, q, k, v with their normed and rotated copies and output; the MLP's residual,
  fp32 norm and gate, up and product), plus a padded batch's mask and its additive copy (L x L x (1 + item)).
- adapter: B x L x (the Qwen3 states it holds, and the largest of a block's phases at its width: attention's q, k,
  v, their normed and rotated copies and output; the MLP's 4-wide hidden, its GELU and the residuals), plus the
  masks' additive copies.
- DiT: B x the larger of a block's two peaks: its feed-forward (image tokens x 11.5 widths, with the 512-token
  context held) and its cross-attention (image tokens x 4 widths, the context and its keys, values and normed keys,
  3 widths a context token); the rope's cos and sin per image token in both. At the demo's size the
  cross-attention's context dominates; at full width the feed-forward (measured: 11.8 widths an image token).
The factors (ACTIVATION_FACTOR) scale the structural bytes to what `scripts/calibrate_working_memory.py` measured on
CPU (torch 2.13, peak live bytes, fp32, batches raised to 8 MiB) on the demo (64-256 px) and on the full-width DiT and
adapter with two blocks (256 and 512 px), so the estimates lie within 1.0-1.3 of the measurement. On CUDA the
same formulas apply, unverified there until the script is run on a GPU.
"""

from __future__ import annotations

from invokeai.backend.cache import causal_vae
from invokeai.backend.cache.estimate import (
    AttentionCall,
    CallFacts,
    ConfigLike,
    WorkingMemory,
    config_dict,
    fp32_bytes,
)
from invokeai.backend.families.anima.constants import (
    CONDITIONING_TOKENS,
    LATENT_SCALE,
    MAX_SEQUENCE_LENGTH,
    PATCH,
)

ROTARY_BYTES = 8  # cos and sin per pair of head channels
# Widths a DiT image token holds at a block's feed-forward (input, residual, normed and modulated input, the 4-wide
# hidden layer and its GELU, output: 11.8 measured at full width) and at its cross-attention (input, normed query,
# its projection and output: 4.1 measured on the demo); widths each context token's keys, values and normed keys
# take then.
FEED_FORWARD_WIDTHS = 11.5
CROSS_ATTENTION_WIDTHS = 4
CONTEXT_WIDTHS = 3
ACTIVATION_FACTOR = {"text_encoder": 1.1, "text_conditioner": 1.0, "transformer": 1.1}


def _scaled(operation: str, structural_bytes: float) -> int:
    return int(ACTIVATION_FACTOR[operation] * structural_bytes)


# --- text encoder -------------------------------------------------------------------------------------------


def text_encoder(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    tokens = facts.prompt_tokens or MAX_SEQUENCE_LENGTH
    hidden, inner, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    width, kv_width = heads * head_dim, kv_heads * head_dim
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    held = hidden * item + 2 * head_dim * item  # the embedding output, the rotary cos and sin
    attention = 2 * hidden * item + hidden * f32 + 3 * (width + 2 * kv_width) * item + width * item
    if facts.text_padded:
        attention += 2 * width * item  # K and V repeated to the query heads
    mlp = hidden * item + hidden * f32 + 3 * inner * item
    per_sequence = tokens * (held + max(attention, mlp))
    if facts.text_padded:
        per_sequence += tokens * tokens * (1 + item)  # the bool mask and SDPA's additive copy of it
    call = AttentionCall(
        num_heads=facts.batch * heads,
        query_len=tokens,
        key_len=tokens,
        head_dim=head_dim,
        kv_heads=None if facts.text_padded or kv_heads == heads else facts.batch * kv_heads,
        has_attn_mask=facts.text_padded,
        is_causal=not facts.text_padded,
        count=layers,
        batch=facts.batch,
    )
    return WorkingMemory(_scaled("text_encoder", facts.batch * per_sequence), [call])


# --- adapter ------------------------------------------------------------------------------------------------


def text_conditioner(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    tokens = facts.prompt_tokens or MAX_SEQUENCE_LENGTH
    source, width, target = c.get("source_dim", 1024), c.get("model_dim", 1024), c.get("target_dim", 1024)
    heads, layers = c.get("num_attention_heads", 16), c.get("num_layers", 6)
    head_dim = width // heads
    item = facts.dtype.itemsize
    held = source * item + target * item + 2 * ROTARY_BYTES * head_dim  # the states, the embedded queries, rotary
    attention = 9 * width * item  # residual, normed, q, k, v, normed and rotated q and k, output
    # The residuals and normed input, the hidden layer (mlp_ratio wide) and its GELU.
    mlp = int(3 + 2 * c.get("mlp_ratio", 4.0)) * width * item
    per_sequence = tokens * (held + max(attention, mlp))
    padded_out = max(tokens, c.get("min_sequence_length", CONDITIONING_TOKENS)) * target * item
    activation = _scaled("text_conditioner", facts.batch * (per_sequence + padded_out))
    calls = [
        AttentionCall(
            num_heads=facts.batch * heads,
            query_len=tokens,
            key_len=tokens,
            head_dim=head_dim,
            has_attn_mask=True,
            count=layers,
            batch=facts.batch,
        )
        for _ in ("self", "cross")
    ]
    return WorkingMemory(activation, calls)


# --- transformer --------------------------------------------------------------------------------------------


def image_tokens(facts: CallFacts) -> int:
    side = LATENT_SCALE * PATCH
    return (facts.height // side) * (facts.width // side)


def transformer(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    heads, head_dim = c["num_attention_heads"], c["attention_head_dim"]
    width = heads * head_dim
    image = image_tokens(facts)
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    rotary = 2 * head_dim * f32  # the rope's cos and sin per image token
    context = CONDITIONING_TOKENS * c["text_embed_dim"] * item
    # A block's two peaks (see the module docstring): its feed-forward over the image tokens, with the context held,
    # and its cross-attention, where the context's keys and values (and the normed keys) are live beside it.
    feed_forward = image * (FEED_FORWARD_WIDTHS * width * item + rotary) + context
    cross = (
        image * (CROSS_ATTENTION_WIDTHS * width * item + rotary)
        + context
        + CONTEXT_WIDTHS * width * item * (CONDITIONING_TOKENS)
    )
    activation = _scaled("transformer", facts.batch * max(feed_forward, cross))
    self_attention = AttentionCall(
        num_heads=facts.batch * heads,
        query_len=image,
        key_len=image,
        head_dim=head_dim,
        count=c["num_layers"],
        batch=facts.batch,
    )
    cross_attention = AttentionCall(
        num_heads=facts.batch * heads,
        query_len=image,
        key_len=CONDITIONING_TOKENS,
        head_dim=head_dim,
        count=c["num_layers"],
        batch=facts.batch,
    )
    return WorkingMemory(activation, [self_attention, cross_attention])


# --- VAE ----------------------------------------------------------------------------------------------------


def vae_decode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return causal_vae.vae_decode(config, facts, LATENT_SCALE)


def vae_encode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return causal_vae.vae_encode(config, facts)


ESTIMATORS = {
    "text_encoder": text_encoder,
    "text_conditioner": text_conditioner,
    "transformer": transformer,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
