"""Working memory of Krea-2 components: Qwen3-VL text model, Krea2Transformer2DModel (one call), Qwen-Image VAE decode.

Attention calls follow the diffusers/transformers code paths, read off the component's config:
- Qwen3-VL text model (Krea2Pipeline.get_text_hidden_states): every layer attends over the whole template block,
  the 34-token system prefix plus the prompt padded to `prompt_tokens` (the pipeline's max_sequence_length). A
  padded block passes a bool (B, 1, L, L) mask and K/V repeated to the query heads; an unpadded one runs causal
  with grouped K/V (`enable_gqa`), which the score matrix does not depend on.
- Krea2Transformer2DModel: the text fusion's layerwise blocks attend across the tapped-layer axis for every token
  (B x T sequences of `num_text_layers`, no mask), its refiner blocks across the tokens (B, 1, 1, T mask), and each
  main block over text + image tokens (B, 1, 1, T + img mask); the processor repeats grouped K/V heads before SDPA,
  so every call has the query head count. The pipeline always passes the text mask. Guidance is two batch-1 calls,
  so a call's batch is the images per call, not doubled.
- AutoencoderKLQwenImage decode: `attn_scales` only adds attention to encoder down blocks; the mid block always
  has one single-head attention as wide as the deepest block (384 in the real Qwen-Image VAE) over the latent
  pixels of each frame, so decode makes one call per image (invokeai/backend/cache/causal_vae.py).

Activation terms (B: batch; item: element size; f32: 4 bytes for what runs in fp32 whatever the dtype; D, I:
hidden and MLP widths; H: query heads x head_dim; T: prompt tokens; L = T + 34; K: tapped layers; N = T + image):
- text encoder: B x L x ((layers + 1) D item + max(attention, MLP)) + B x L^2 x (1 + item) when padded: every
  hidden state is returned (the pipeline taps several), the bool mask and SDPA's additive copy of it; attention
  2 D item + D f32 + 8 H item (residual, fp32 RMSNorm, q, repeated k/v, rotary temporaries, output), MLP
  2 D item + D f32 + 4 I item (gate, up, activation, product). x 1.0.
- transformer: B x max(T K x fusion block, N x main block + T K text_dim item), a block's peak per token being
  max(attention 7 W item + W f32, feed-forward 2 W item + W f32 + 4 I item); main blocks add their time-modulated
  input (W item) and fp32 rotary temporaries (3 W f32) to attention. x 1.0.
- VAE decode: the AutoencoderKLQwenImage walk (invokeai/backend/cache/causal_vae.py), which carries its own
  calibration.
The factors scale the structural bytes to what `scripts/calibrate_working_memory.py` measured on CPU for the demo
models (peak live bytes, fp32), so the estimate lies between 1.0 and 1.3 times the measurement. On CUDA the same
formulas apply, unverified there until the script is run on a GPU.
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
from invokeai.backend.families.krea2.constants import LATENT_SCALE, PATCH, PROMPT_TOKENS, TEMPLATE_PREFIX_TOKENS

ACTIVATION_FACTOR = {
    "text_encoder": 1.0,
    "transformer": 1.0,
}


def _scaled(component: str, structural_bytes: float) -> int:
    return int(ACTIVATION_FACTOR[component] * structural_bytes)


def _prompt_tokens(facts: CallFacts) -> int:
    return facts.prompt_tokens or PROMPT_TOKENS


# --- text encoder -------------------------------------------------------------------------------------------


def text_encoder(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    text = config_dict(c.get("text_config", c))
    tokens = _prompt_tokens(facts) + TEMPLATE_PREFIX_TOKENS
    hidden, inner, layers = text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"]
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or hidden // heads
    width = heads * head_dim
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    # Attention: residual, RMSNorm (fp32 inside), q, repeated k and v, rotary temporaries, output, o_proj input.
    attention = 2 * hidden * item + hidden * f32 + 8 * width * item
    # SwiGLU MLP: residual and norm output, gate, up, activation, product.
    mlp = 2 * hidden * item + hidden * f32 + 4 * inner * item
    kept = (layers + 1) * hidden * item  # output_hidden_states: the pipeline taps several layers
    per_sequence = tokens * (kept + max(attention, mlp))
    if facts.text_padded:
        per_sequence += tokens * tokens * (1 + item)  # the bool mask and SDPA's additive copy of it
    activation = _scaled("text_encoder", facts.batch * per_sequence)
    # transformers hands SDPA the grouped key-value heads (enable_gqa) when no mask is passed, and repeats them to
    # the query heads (counted above) when one is.
    kv_heads = text.get("num_key_value_heads", heads)
    call = AttentionCall(
        num_heads=facts.batch * heads,
        query_len=tokens,
        key_len=tokens,
        head_dim=head_dim,
        kv_heads=None if facts.text_padded or head_dim > 256 else facts.batch * kv_heads,
        has_attn_mask=facts.text_padded,
        is_causal=not facts.text_padded,
        count=layers,
        batch=facts.batch,
    )
    return WorkingMemory(activation, [call])


# --- transformer --------------------------------------------------------------------------------------------


def _block_bytes(width: int, inner: int, item: int, f32: int, main: bool) -> int:
    """Bytes per token alive at the peak of a Krea-2 block: attention (input, fp32 norm, q, k and v repeated to the
    query heads, gate, output, gated output) or the SwiGLU feed-forward (input, fp32 norm, gate, up, activation,
    product). Main blocks add the time-modulated input and fp32 rotary temporaries."""
    modulated = width * item if main else 0
    attention = 7 * width * item + width * f32 + modulated + (3 * width * f32 if main else 0)
    feed_forward = 2 * width * item + width * f32 + modulated + 4 * inner * item
    return max(attention, feed_forward)


def image_tokens(facts: CallFacts) -> int:
    side = LATENT_SCALE * PATCH
    return (facts.height // side) * (facts.width // side)


def transformer(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    batch, text = facts.batch, _prompt_tokens(facts)
    tokens = text + image_tokens(facts)
    text_dim, text_heads = c["text_hidden_dim"], c["text_num_attention_heads"]
    layers_tapped = c["num_text_layers"]
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    hidden = c["attention_head_dim"] * c["num_attention_heads"]
    fusion = _block_bytes(text_dim, c["text_intermediate_size"], item, f32, main=False)
    main = _block_bytes(hidden, c["intermediate_size"], item, f32, main=True)
    peak = max(
        text * layers_tapped * fusion,  # layerwise blocks: every token's tapped layers
        tokens * main + text * layers_tapped * text_dim * item,  # main blocks, beside the fused text input
    )
    activation = _scaled("transformer", batch * peak)
    calls = [
        AttentionCall(
            num_heads=batch * text * text_heads,
            query_len=layers_tapped,
            key_len=layers_tapped,
            head_dim=text_dim // text_heads,
            count=c["num_layerwise_text_blocks"],
        ),
        AttentionCall(
            num_heads=batch * text_heads,
            query_len=text,
            key_len=text,
            head_dim=text_dim // text_heads,
            has_attn_mask=True,
            count=c["num_refiner_text_blocks"],
        ),
        AttentionCall(
            num_heads=batch * c["num_attention_heads"],
            query_len=tokens,
            key_len=tokens,
            head_dim=c["attention_head_dim"],
            has_attn_mask=True,
            count=c["num_layers"],
        ),
    ]
    return WorkingMemory(activation, calls)


# --- VAE decode ---------------------------------------------------------------------------------------------


def vae_decode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return causal_vae.vae_decode(config, facts, LATENT_SCALE)


ESTIMATORS = {
    "text_encoder": text_encoder,
    "transformer": transformer,
    "vae_decode": vae_decode,
}
