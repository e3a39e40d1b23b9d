"""Working memory of Qwen-Image operations: the Qwen2.5-VL text model, QwenImageTransformer2DModel (one call: true
CFG runs the positive and the negative as two calls of the same size, one after the other), and AutoencoderKLQwenImage's
decode and encode.

Attention calls follow the diffusers/transformers code paths, read off the component's config:
- Qwen2.5-VL text model (generation.encode_prompt): each layer attends over the templated prompt, `prompt_tokens`
  long (the template's tokens included: the node counts them; None: the most the tokenizer keeps). One prompt, or
  a batch of equal lengths, has no padding: transformers drops the all-true mask and runs causal with the grouped
  key-value heads as they are (`enable_gqa`: 4 of 28 query heads at 7B). A padded batch (`text_padded`) gets a bool
  (B, 1, L, L) mask and K/V repeated to the query heads.
- QwenImageTransformer2DModel: every block's joint attention runs over [text, image] tokens, text first, at the
  transformer's heads; a padded prompt batch adds a (B, 1, 1, T + image) key mask, an unpadded one none (diffusers
  0.37+). The image tokens are (H/16)(W/16); `prompt_tokens` is the longest prompt's embedding length (None: the
  pipeline's max_sequence_length, 512).
- AutoencoderKLQwenImage: the mid block's single-head attention over the deepest level's pixels
  (invokeai/backend/cache/causal_vae.py).

Activation terms (B: batch; item: element size; f32: 4 bytes for what runs in fp32 whatever the dtype; D, I: text
hidden and MLP widths; W: query heads x head_dim; K: key-value heads x head_dim; L: text tokens; for the
transformer W: its width, d: head dim, S = T + image tokens):
- text encoder: B x L x (held + the largest of a layer's phases), x 1.1. Held beside every layer: the embedding
  output (D item), the rotary tables (8 d item) and, padded, the bool mask's row (L bytes). Phases: the rotation
  (2 D + 3 (W + 2K), item), SDPA (2 D + 2 W + 2 K, item; padded, + 2 W for K and V repeated to the query heads and L
  for the mask's additive copy) and the MLP (D item + D f32 + 3.5 I item). The server runs the text model under
  the language-model head (generation.text_model): no logits, and no hidden state but the last is kept.
- text encoder with reference images (Qwen-Image-Edit; `vision_patches`): the vision tower runs first, over all the
  images' patches P (batch 1, every image in one sequence): per patch the patch embedding, the rotary tables (fp32)
  and a window-ordered copy, and a block's larger phase, attention (7 D + 2 D f32: residual, normalised input, qkv,
  q and k rotated in fp32, the output and its projection) or the MLP (2 D + 3 I: residual, normalised input, gate,
  up and their product; widths fitted to the measured peaks). The pixels are the call's input, as the text's token
  ids are. The text layers then run over the prompt with the image tokens (`prompt_tokens` counts them), holding two
  more copies of the embeddings (the tokens' own and the image features scattered in). The larger of the two is
  priced.
- transformer: B x the largest of a block's three phases, in widths W of item per token, + the rotary tables
  (complex64, 4 d bytes a token). A block keeps its locals until it returns, and its caller the block's input:
  during the image stream's feed-forward an image token holds 15 (input, new residual, normalised and modulated
  input, attention output, normalised and modulated feed-forward input, the 4 W projection and its GELU) and a
  text token 5 (input, residual, normalised and modulated input, attention output); during the text stream's
  feed-forward a text token holds 15 and an image token 8 (its feed-forward output too); during the joint
  attention every token holds 10 (input, normalised and modulated input, its q, k, v, the joint q, k, v, the
  output) and two fp32 widths (the rotation runs in complex64). x 1.1 (the phases alone were 0.99-1.01 of the
  measured peak, demo and full width).
- VAE decode and encode: the AutoencoderKLQwenImage walks (invokeai/backend/cache/causal_vae.py).
The factors scale the structural bytes to what `scripts/calibrate_working_memory.py` measured on CPU (torch 2.13,
peak live bytes, fp32, batches raised to 8 MiB), see ACTIVATION_FACTOR. Calibration figures: docs/families.md,
"Calibration". On CUDA the same formulas apply, unverified there until the script is run on a GPU.
"""

from __future__ import annotations

from collections import Counter

from invokeai.backend.cache import causal_vae
from invokeai.backend.cache.estimate import (
    AttentionCall,
    CallFacts,
    ConfigLike,
    WorkingMemory,
    config_dict,
    fp32_bytes,
)
from invokeai.backend.families.qwen_image.constants import (
    LATENT_SCALE,
    MAX_SEQUENCE_LENGTH,
    PATCH,
    TEMPLATE_PREFIX_TOKENS,
    TOKENIZER_MAX_LENGTH,
)

ROTARY_BYTES = 8  # a complex64 rotary factor per pair of head channels, whatever the dtype
# Transformer widths a token holds while a block runs (see the module docstring): in the feed-forward of its own
# stream, in the other stream's before (text, during the image's) and after (image, during the text's) its own, and
# in the joint attention.
MLP_PEAK_WIDTHS, MLP_OTHER_STREAM_WIDTHS, MLP_DONE_STREAM_WIDTHS, ATTENTION_WIDTHS = 15, 5, 8, 10
ACTIVATION_FACTOR = {"text_encoder": 1.1, "transformer": 1.1, "vision": 1.1}


def _scaled(operation: str, structural_bytes: float) -> int:
    return int(ACTIVATION_FACTOR[operation] * structural_bytes)


# --- text encoder -------------------------------------------------------------------------------------------


def text_encoder(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    text = config_dict(c.get("text_config", c))
    tokens = facts.prompt_tokens or TOKENIZER_MAX_LENGTH + TEMPLATE_PREFIX_TOKENS
    hidden, inner, layers = text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"]
    heads = text["num_attention_heads"]
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = hidden // heads  # Qwen2.5-VL's attention derives it so
    width, kv_width = heads * head_dim, kv_heads * head_dim
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    # Per token, beside every layer: the embedding output the text model holds, the rotary tables (cos and sin on
    # the three mRoPE axes and the layer's merged pair), and a padded batch's bool (L, L) mask row.
    held = hidden * item + 8 * head_dim * item + (tokens if facts.text_padded else 0)
    if facts.vision_patches:
        # The embeddings with the image features scattered in, and the tokens' own beside them (measured: 2 widths).
        held += 2 * hidden * item
    # A layer's phases: the rotation (residual, normalised input, q, k, v, their rotated copies and rotate_half
    # temporaries), SDPA (residual, normalised input, rotated q and k, v, the output; a padded batch adds K and V
    # repeated to the query heads and the mask's additive copy) and the MLP (residual and its fp32 norm, the gate's
    # activation, up, their product and the transient gate: 3.5 widths measured).
    rotation = 2 * hidden * item + 3 * (width + 2 * kv_width) * item
    sdpa = 2 * hidden * item + (2 * width + 2 * kv_width) * item
    if facts.text_padded:
        sdpa += 2 * width * item + tokens * item
    mlp = hidden * item + hidden * f32 + int(3.5 * inner) * item
    per_sequence = tokens * (held + max(rotation, sdpa, mlp))
    activation = _scaled("text_encoder", facts.batch * per_sequence)
    vision_calls: list[AttentionCall] = []
    if facts.vision_patches:
        vision = config_dict(c["vision_config"])
        activation = max(activation, vision_activation(vision, facts))
        vision_calls = vision_attention(vision, facts)
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
    return WorkingMemory(activation, [*vision_calls, call])


def _spans(cells: int, window: int) -> list[int]:
    """The sizes of the windows `cells` merged cells are cut into along one side (the last one partial)."""
    return [window] * (cells // window) + ([cells % window] if cells % window else [])


def vision_attention(vision: dict, facts: CallFacts) -> list[AttentionCall]:
    """Qwen2.5-VL's vision tower under SDPA: every block attends within each image (full-attention blocks) or each
    window of `window_size` pixels (the others), one unmasked call per image or window, all images in one batch."""
    heads, merge = vision["num_heads"], vision["spatial_merge_size"]
    head_dim = vision["hidden_size"] // heads
    depth = vision["depth"]
    full = len({index for index in vision.get("fullatt_block_indexes", ()) if 0 <= index < depth})
    window = vision["window_size"] // merge // vision["patch_size"]
    lengths: Counter[int] = Counter()
    for rows, columns in facts.vision_patches:
        lengths[rows * columns] += full * facts.batch
        for window_rows in _spans(rows // merge, window):
            for window_columns in _spans(columns // merge, window):
                lengths[window_rows * window_columns * merge * merge] += (depth - full) * facts.batch
    return [
        AttentionCall(num_heads=heads, query_len=length, key_len=length, head_dim=head_dim, count=count)
        for length, count in sorted(lengths.items())
        if count
    ]


def vision_activation(vision: dict, facts: CallFacts) -> int:
    hidden, inner = vision["hidden_size"], vision["intermediate_size"]
    head_dim = hidden // vision["num_heads"]
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    patches = facts.batch * sum(rows * columns for rows, columns in facts.vision_patches)
    # Beside every block: the patch embedding, the rotary tables and their window-ordered copies (the pixels are
    # the call's input, as the text's token ids are).
    held = hidden * item + 4 * head_dim * f32
    attention = 7 * hidden * item + 2 * hidden * f32
    mlp = 2 * hidden * item + 3 * inner * item
    return _scaled("vision", patches * (held + max(attention, mlp)))


# --- transformer --------------------------------------------------------------------------------------------


def image_tokens(facts: CallFacts) -> int:
    """The generated image's tokens and the reference images' (Qwen-Image-Edit), which the transformer appends."""
    side = LATENT_SCALE * PATCH
    references = sum((height // side) * (width // side) for width, height in facts.reference_sizes)
    return (facts.height // side) * (facts.width // side) + references


def transformer(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    heads, head_dim = c["num_attention_heads"], c["attention_head_dim"]
    width = heads * head_dim
    text, image = facts.prompt_tokens or MAX_SEQUENCE_LENGTH, image_tokens(facts)
    tokens = text + image
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    # Widths per token at each phase of a block's peak (see the module docstring): the image stream's feed-forward,
    # the text stream's, and the joint attention.
    image_mlp = (MLP_PEAK_WIDTHS * image + MLP_OTHER_STREAM_WIDTHS * text) * width * item
    text_mlp = (MLP_DONE_STREAM_WIDTHS * image + MLP_PEAK_WIDTHS * text) * width * item
    attention = tokens * (ATTENTION_WIDTHS * width * item + 2 * width * f32)
    peak = max(image_mlp, text_mlp, attention) + tokens * ROTARY_BYTES * head_dim // 2
    activation = _scaled("transformer", facts.batch * peak)
    # A padded prompt batch masks its padding; the masked calls are the same whatever the guidance (two calls).
    call = AttentionCall(
        num_heads=facts.batch * heads,
        query_len=tokens,
        key_len=tokens,
        head_dim=head_dim,
        has_attn_mask=facts.text_padded,
        count=c["num_layers"],
        batch=facts.batch,
    )
    return WorkingMemory(activation, [call])


# --- VAE ----------------------------------------------------------------------------------------------------


def vae_decode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return causal_vae.vae_decode(config, facts, LATENT_SCALE)


def vae_encode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return causal_vae.vae_encode(config, facts)


ESTIMATORS = {
    "text_encoder": text_encoder,
    "transformer": transformer,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
