"""Working memory of Stable Diffusion 1.x components: CLIP text encoder, UNet (one denoise step), VAE decode/encode.

Attention calls follow the diffusers/transformers code paths, read off the component's config:
- CLIPTextModel: one causal self-attention per layer over the padded prompt (77 tokens), no mask tensor.
- UNet2DConditionModel: every BasicTransformerBlock of a cross-attention block makes a self-attention over the
  latent pixels of its level and a cross-attention (key length = prompt tokens); heads per block from
  `num_attention_heads`, or `attention_head_dim`, which SD-1 configs use for the head count (diffusers' legacy
  naming); head_dim = block channels / heads. Classifier-free guidance runs the UNet on a doubled batch.
- AutoencoderKL: the mid block's attention (when `mid_block_add_attention`), one head as wide as the deepest block,
  over the latent pixels, once in decode and once in encode.

Activation terms (B: batch, doubled for the guided UNet; item: element size; p: pixels of a level; c: channels):
- text encoder: B x tokens x (3 hidden + max(6 hidden, 4 intermediate)) x item: residual, norm and last hidden
  state beside either q/k/v/output or the MLP's fc1 output and quick_gelu's temporaries.
- UNet: a walk over the forward pass tracks the skip connections the down path stores and the up path consumes
  (conv_in, every resnet and downsampler output) and, at each step, its working set: a resnet 2 c_in + 2 c_out
  (+ c_out for a width-changing shortcut), an up-block resnet also its concatenated input 2 (c_hidden + c_skip), a
  transformer block 19 c (its GEGLU feed-forward: input, residual, norm, the 8 c projection, GELU and product of
  4 c each), an upsampler c p + 2 c (4 p). Activation = 1.35 x B x item x max(skips held + step).
- VAE decode: max over the steps of the decoder: mid block 7 C (norm, q, k, v, output, projection), resnets as
  above, upsamplers c p + (2 + fp32/item for bf16) c (4 p), the head 3 c P. x 1.07.
- VAE encode: the image, conv_in's output and its padded copy at full size, resnets as above, downsamplers (an
  asymmetrically padded copy, then the stride-2 conv) 2 c p + c p / 4, the mid block 7 C. x 1.15.
The factors scale the walk to what `scripts/calibrate_working_memory.py` measured on CPU for the demo models (peak
live bytes, fp32, 64-256 px, batches raised to 8 MiB), so the estimate lies between 1.0 and 1.3 times the
measurement; they cover buffers of a few kilobytes, allocator rounding and oneDNN's reorders that the walk leaves
out. On CUDA the same formulas apply, unverified there until the script is run on a GPU.
"""

from __future__ import annotations

import torch

from invokeai.backend.cache.estimate import (
    AttentionCall,
    CallFacts,
    ConfigLike,
    WorkingMemory,
    config_dict,
    fp32_bytes,
    halve,
    per_block,
)

FAMILY = "sd-1"
CLIP_TOKENS = 77  # SD pipelines pad every prompt to CLIP's full context
LATENT_SCALE = 8  # the SD VAE's spatial factor: 2 ** (len(block_out_channels) - 1) with four blocks

# Calibrated on CPU (see the module docstring); the walk, not these, carries the scaling with size and batch.
ACTIVATION_FACTOR = {
    "text_encoder": 1.0,
    "unet": 1.35,
    "vae_decode": 1.07,
    "vae_encode": 1.15,
}


def _scaled(component: str, structural_bytes: float) -> int:
    return int(ACTIVATION_FACTOR[component] * structural_bytes)


# --- text encoder -------------------------------------------------------------------------------------------


def text_encoder(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    tokens = facts.prompt_tokens or c.get("max_position_embeddings", CLIP_TOKENS)
    hidden, inner, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    # Per layer: residual and layer-norm output, then either q/k/v/attention output or the MLP's fc1 output and
    # quick_gelu's three temporaries (scaled input, sigmoid, product); the last hidden state is returned.
    per_token = 3 * hidden + max(6 * hidden, 4 * inner)
    activation = _scaled("text_encoder", facts.batch * tokens * per_token * facts.dtype.itemsize)
    calls = [
        AttentionCall(
            num_heads=facts.batch * heads,
            query_len=tokens,
            key_len=tokens,
            head_dim=hidden // heads,
            is_causal=True,
            count=c["num_hidden_layers"],
        )
    ]
    return WorkingMemory(activation, calls)


# --- UNet ---------------------------------------------------------------------------------------------------


def _resnet(c_in: int, c_out: int) -> int:
    """Elements per pixel alive inside a ResnetBlock2D: its input (kept for the shortcut), the norm/activation
    temporary, both conv outputs, and the 1x1 shortcut's output when the width changes."""
    return 2 * c_in + 2 * c_out + (c_out if c_in != c_out else 0)


def _transformer(channels: int) -> int:
    """Elements per pixel alive at a Transformer2DModel's peak, its GEGLU feed-forward: the block input and
    residual, the norm output, the 8x projection, the GELU of its gate half and the product (4x each)."""
    return 3 * channels + 8 * channels + 4 * channels + 4 * channels


def _unet_peak_elements(c: dict, latent_h: int, latent_w: int) -> int:
    """Peak elements per batch entry over one UNet forward, skip connections included."""
    channels = list(c["block_out_channels"])
    levels = len(channels)
    layers = per_block(c.get("layers_per_block", 2), levels)
    pixels = [halve(latent_h, i) * halve(latent_w, i) for i in range(levels)]
    down_attn = ["CrossAttn" in t for t in c["down_block_types"]]
    up_attn = ["CrossAttn" in t for t in c["up_block_types"]]
    peak = 0
    skips = [channels[0] * pixels[0]]  # conv_in's output is the first skip
    hidden = channels[0]
    for i in range(levels):
        for _ in range(layers[i]):
            step = _resnet(hidden, channels[i])
            if down_attn[i]:
                step = max(step, _transformer(channels[i]))
            peak = max(peak, sum(skips) + step * pixels[i])
            hidden = channels[i]
            skips.append(hidden * pixels[i])
        if i < levels - 1:
            skips.append(hidden * pixels[i + 1])
    deepest = pixels[-1]
    mid = max(_resnet(hidden, hidden), _transformer(hidden)) if c.get("mid_block_type") != "UNetMidBlock2D" else 0
    peak = max(peak, sum(skips) + mid * deepest)
    reversed_layers = list(reversed(layers))
    for j in range(levels):
        level = levels - 1 - j
        out = channels[level]
        for _ in range(reversed_layers[j] + 1):
            skip = skips.pop()
            skip_channels = skip // pixels[level]
            # The concatenated input sits beside its two halves until the resnet's first norm reads it.
            concat = 2 * (hidden + skip_channels)
            step = concat + _resnet(hidden + skip_channels, out)
            if up_attn[j]:
                step = max(step, _transformer(out))
            peak = max(peak, sum(skips) + skip + step * pixels[level])
            hidden = out
        if level > 0:
            # Upsample2D: nearest interpolation to the next level's size, then a 3x3 conv.
            peak = max(peak, sum(skips) + hidden * pixels[level] + 2 * hidden * pixels[level - 1])
    return peak


def unet_attention_calls(c: dict, facts: CallFacts, batch: int, text_tokens: int) -> list[AttentionCall]:
    channels = list(c["block_out_channels"])
    levels = len(channels)
    latent_h, latent_w = facts.height // LATENT_SCALE, facts.width // LATENT_SCALE
    heads = per_block(c.get("num_attention_heads") or c["attention_head_dim"], levels)
    layers = per_block(c.get("layers_per_block", 2), levels)
    depth = per_block(c.get("transformer_layers_per_block", 1), levels)
    reverse_depth = c.get("reverse_transformer_layers_per_block") or list(reversed(depth))
    reverse_depth = [d if isinstance(d, int) else max(d) for d in reverse_depth]
    only_cross = per_block(c.get("only_cross_attention", False), levels)
    # Blocks (level, number of BasicTransformerBlocks) that attend, in forward order.
    blocks: list[tuple[int, int]] = []
    for i, kind in enumerate(c["down_block_types"]):
        if "CrossAttn" in kind:
            blocks.append((i, layers[i] * depth[i]))
    if c.get("mid_block_type", "UNetMidBlock2DCrossAttn") == "UNetMidBlock2DCrossAttn":
        blocks.append((levels - 1, depth[-1]))
    reversed_layers = list(reversed(layers))
    for j, kind in enumerate(c["up_block_types"]):
        if "CrossAttn" in kind:
            blocks.append((levels - 1 - j, (reversed_layers[j] + 1) * reverse_depth[j]))
    # Calls of the same shape are merged, so a call list reads as one line per level and kind.
    counts: dict[tuple[int, int, int, int], int] = {}
    for level, n in blocks:
        tokens = halve(latent_h, level) * halve(latent_w, level)
        head_count = heads[level]
        head_dim = channels[level] // head_count
        self_key = text_tokens if only_cross[level] else tokens
        for key in (self_key, text_tokens):
            shape = (batch * head_count, tokens, key, head_dim)
            counts[shape] = counts.get(shape, 0) + n
    return [AttentionCall(h, q, k, d, count=n) for (h, q, k, d), n in counts.items()]


def unet(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    batch = facts.batch * (2 if facts.guidance else 1)
    text_tokens = facts.prompt_tokens or CLIP_TOKENS
    latent_h, latent_w = facts.height // LATENT_SCALE, facts.width // LATENT_SCALE
    elements = _unet_peak_elements(c, latent_h, latent_w)
    activation = _scaled("unet", batch * elements * facts.dtype.itemsize)
    return WorkingMemory(activation, unet_attention_calls(c, facts, batch, text_tokens))


# --- VAE ----------------------------------------------------------------------------------------------------


def _vae_attention(c: dict, facts: CallFacts) -> list[AttentionCall]:
    if not c.get("mid_block_add_attention", True):
        return []
    channels = list(c["block_out_channels"])
    scale = 2 ** (len(channels) - 1)
    tokens = (facts.height // scale) * (facts.width // scale)
    return [AttentionCall(num_heads=facts.batch, query_len=tokens, key_len=tokens, head_dim=channels[-1])]


def _vae_mid(channels: int) -> int:
    """Elements per latent pixel at the mid block's attention: input, group norm, q/k/v, output, projection."""
    return 7 * channels


def vae_decode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    channels = list(reversed(c["block_out_channels"]))
    levels = len(channels)
    layers = c.get("layers_per_block", 2) + 1  # decoder blocks have one resnet more than encoder blocks
    h, w = facts.height // 2 ** (levels - 1), facts.width // 2 ** (levels - 1)
    item = facts.dtype.itemsize
    # Nearest upsampling runs in fp32 for bf16 inputs (diffusers' Upsample2D), so its output may be wider.
    up_item = fp32_bytes(facts.dtype) if facts.dtype == torch.bfloat16 else item
    peak = _vae_mid(channels[0]) * h * w * item
    hidden = channels[0]
    for k, out in enumerate(channels):
        pixels = h * w
        for _ in range(layers):
            peak = max(peak, _resnet(hidden, out) * pixels * item)
            hidden = out
        if k < levels - 1:
            h, w = 2 * h, 2 * w
            peak = max(peak, hidden * pixels * item + hidden * h * w * (up_item + 2 * item))
    # norm_out, activation and conv_out at full resolution
    peak = max(peak, 3 * hidden * h * w * item)
    activation = _scaled("vae_decode", facts.batch * peak)
    return WorkingMemory(activation, _vae_attention(c, facts))


def vae_encode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    channels = list(c["block_out_channels"])
    levels = len(channels)
    layers = c.get("layers_per_block", 2)
    h, w = facts.height, facts.width
    item = facts.dtype.itemsize
    hidden = channels[0]
    peak = (c.get("in_channels", 3) + 2 * hidden) * h * w  # the image, conv_in's output and its padded copy
    for k, out in enumerate(channels):
        for _ in range(layers):
            peak = max(peak, _resnet(hidden, out) * h * w)
            hidden = out
        if k < levels - 1:
            # Downsample2D pads asymmetrically (a full copy) before its stride-2 conv.
            peak = max(peak, 2 * hidden * h * w + hidden * (h // 2) * (w // 2))
            h, w = h // 2, w // 2
    peak = max(peak, _vae_mid(hidden) * h * w)
    activation = _scaled("vae_encode", facts.batch * peak * item)
    return WorkingMemory(activation, _vae_attention(c, facts))


ESTIMATORS = {
    (FAMILY, "text_encoder"): text_encoder,
    (FAMILY, "unet"): unet,
    (FAMILY, "vae_decode"): vae_decode,
    (FAMILY, "vae_encode"): vae_encode,
}
