"""Working memory of the CLIP text encoder, the UNet2DConditionModel (one denoise step) and the AutoencoderKL
(decode and encode): the walks over their forward passes and their attention calls, read off each component's config.

Any family whose pipeline holds these diffusers/transformers classes prices them here (a family's estimators module
passes its latent scale, its calibrated factors and its prompt length); the numbers below were calibrated on the
SD-1.5-style demo model, the first family that used them.

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
  4 c each), a downsampler 2 c (p / 4) beside its input skip, an upsampler c p + 2 c (4 p). Activation =
  max(1.35 x B x item x (skips held + step) + the step's weight copy): on CPU oneDNN reorders every convolution's
  weight into its blocked layout on each call (PyTorch does not prepack eager weights), a copy alive beside the
  activations, not per image and not scaled by the factor. The step's largest weight is taken (a resnet's conv1 or
  conv2, a sampler's conv, a transformer's 1x1 proj_in/proj_out). At full size this term dominates small images:
  up_blocks.1's first conv1 (2560 to 1280 channels, 3x3) copies 113 MiB in fp32, more than the UNet's activations
  at 256 px, and without it the estimate was 0.57 of the measured peak there.
- VAE (decode and encode): a walk over the forward pass keeps, beside each step's working set, what the callers hold
  (the block input the decoder/encoder keeps while a block runs, the upsampler's or downsampler's input,
  post_quant_conv's output). Resnets: input kept for the shortcut, norm + SiLU, conv1, norm + SiLU, conv2, the 1x1
  shortcut, the sum and its scaled copy. Upsamplers: input, nearest output (fp32 copies for bf16), conv; downsamplers:
  input, the asymmetrically padded copy, stride-2 conv; mid block 7 C for its attention; the head (norm, SiLU, conv_out;
  quant_conv and the posterior in encode). Every convolution adds what PyTorch's CPU path allocates (`_Convs.extra`):
  oneDNN's reorders into its channel-blocked layout, whose block (8 channels on AVX2, 16 on AVX-512) pads narrow layers,
  so the machine's block is priced (the larger where it is not known); nothing beyond the output for channels-last
  tensors (the decoder after the mid block's attention, fp32 batches of two or more); slow_conv2d's 9x columns for a
  small one-image input; for 16-bit dtypes, oneDNN's channels-last kernels' NHWC copy of the input beside the NHWC
  output and its copy into the returned tensor; and, beside any oneDNN layout, the weight copy (as the UNet's, spread
  over the batch because the walk counts per batch entry). Decode x 1.07, encode x 1.05.
The factors scale the walk to what `scripts/calibrate_working_memory.py` measured on CPU for the demo models (peak
live bytes, fp32, 64-256 px, batches raised to 8 MiB), so the estimate lies between 1.0 and 1.3 times the
measurement; they cover buffers of a few kilobytes, allocator rounding and, for the UNet and text encoder, oneDNN's
activation reorders that their walks leave out. The VAE walks match the measured peak within 2% on an AVX-512
machine (the factors' margin); priced with AVX-512's 16-channel blocks, they overestimated an AVX2-only machine's
(an AMD EPYC; ONEDNN_MAX_CPU_ISA=AVX2 reproduces its figures elsewhere) by up to 32%, since 8-channel blocks pad
less, so each machine's block is priced. The
demo models' weights are too small to show the weight copies: `--full-size` measures the same formulas on a
full-size SD-1.5 (the shipped config, 256 and 512 px), where they are 1.05-1.14 times the measured peak (the table
is in docs/api.md, "Memory"). On CUDA the same formulas apply without the weight copies (NCHW convolutions priced
as on the CPU), unverified there until the script is run on a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

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

# CLIP's context: every prompt is padded to 77 tokens (the text encoders' max_position_embeddings).
CLIP_TOKENS = 77
# The VAE walks' factors, calibrated on CPU (see the module docstring); the walk, not these, carries the scaling with
# size and batch. A family's own factors for the text encoder and the UNet are its estimators' arguments.
VAE_FACTOR = {"vae_decode": 1.07, "vae_encode": 1.05}


def weight_copy_bytes(facts: CallFacts) -> int:
    """Bytes per weight element that a convolution copies per call: on CPU, oneDNN reorders every weight into its
    blocked layout on each call (PyTorch does not prepack eager-mode weights), and that copy lives beside the
    activations while the convolution runs. A full-size SD-1.5 UNet's largest, up_blocks.1's first conv1 (2560 to
    1280 channels, 3x3), is 113 MiB in fp32: at 256 px more than all its activations. Nothing elsewhere."""
    return facts.dtype.itemsize if facts.device.type == "cpu" else 0


# --- text encoder -------------------------------------------------------------------------------------------


def clip_text_encoder(config: ConfigLike, facts: CallFacts, factor: float = 1.0) -> WorkingMemory:
    """CLIPTextModel on the padded prompt, its walk scaled by the family's calibrated `factor`."""
    c = config_dict(config)
    tokens = facts.prompt_tokens or c.get("max_position_embeddings", CLIP_TOKENS)
    hidden, inner, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    # Per layer: residual and layer-norm output, then either q/k/v/attention output or the MLP's fc1 output and
    # quick_gelu's three temporaries (scaled input, sigmoid, product); the last hidden state is returned.
    per_token = 3 * hidden + max(6 * hidden, 4 * inner)
    activation = int(factor * (facts.batch * tokens * per_token * facts.dtype.itemsize))
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


def _resnet_weights(c_in: int, c_out: int) -> int:
    """Elements of a ResnetBlock2D's largest convolution weight: conv1 (c_in to c_out) or conv2 (c_out to c_out)."""
    return 9 * max(c_in, c_out) * c_out


def _transformer_weights(channels: int) -> int:
    """Elements of a Transformer2DModel's proj_in/proj_out weight (1x1 convolutions in SD-1)."""
    return channels * channels


def _transformer(channels: int) -> int:
    """Elements per pixel alive at a Transformer2DModel's peak, its GEGLU feed-forward: the block input and
    residual, the norm output, the 8x projection, the GELU of its gate half and the product (4x each)."""
    return 3 * channels + 8 * channels + 4 * channels + 4 * channels


def unet_peak_bytes(c: dict, latent_h: int, latent_w: int, entry_bytes: float, weight_bytes: int) -> int:
    """Peak bytes over one UNet forward: `entry_bytes` per activation element of one batch entry (batch, element
    size and the activation factor), skip connections included, plus `weight_bytes` per element of the weight
    copy the step's largest convolution makes (0 where none is made)."""
    channels = list(c["block_out_channels"])
    levels = len(channels)
    layers = per_block(c.get("layers_per_block", 2), levels)
    pixels = [halve(latent_h, i) * halve(latent_w, i) for i in range(levels)]
    down_attn = ["CrossAttn" in t for t in c["down_block_types"]]
    up_attn = ["CrossAttn" in t for t in c["up_block_types"]]
    peak = 0.0

    def at(activation: int, weights: int) -> float:
        return activation * entry_bytes + weights * weight_bytes

    skips = [channels[0] * pixels[0]]  # conv_in's output is the first skip
    hidden = channels[0]
    for i in range(levels):
        for _ in range(layers[i]):
            p = pixels[i]
            peak = max(peak, at(sum(skips) + _resnet(hidden, channels[i]) * p, _resnet_weights(hidden, channels[i])))
            if down_attn[i]:
                peak = max(peak, at(sum(skips) + _transformer(channels[i]) * p, _transformer_weights(channels[i])))
            hidden = channels[i]
            skips.append(hidden * p)
        if i < levels - 1:
            # Downsample2D's stride-2 conv, its input being the last skip.
            peak = max(peak, at(sum(skips) + 2 * hidden * pixels[i + 1], 9 * hidden * hidden))
            skips.append(hidden * pixels[i + 1])
    deepest = pixels[-1]
    if c.get("mid_block_type") != "UNetMidBlock2D":
        peak = max(peak, at(sum(skips) + _resnet(hidden, hidden) * deepest, _resnet_weights(hidden, hidden)))
        peak = max(peak, at(sum(skips) + _transformer(hidden) * deepest, _transformer_weights(hidden)))
    reversed_layers = list(reversed(layers))
    for j in range(levels):
        level = levels - 1 - j
        out = channels[level]
        p = pixels[level]
        for _ in range(reversed_layers[j] + 1):
            skip = skips.pop()
            skip_channels = skip // p
            # The concatenated input sits beside its two halves until the resnet's first norm reads it.
            concat = 2 * (hidden + skip_channels)
            resnet = (concat + _resnet(hidden + skip_channels, out)) * p
            peak = max(peak, at(sum(skips) + skip + resnet, _resnet_weights(hidden + skip_channels, out)))
            if up_attn[j]:
                peak = max(peak, at(sum(skips) + skip + _transformer(out) * p, _transformer_weights(out)))
            hidden = out
        if level > 0:
            # Upsample2D: nearest interpolation to the next level's size, then a 3x3 conv.
            upsample = hidden * p + 2 * hidden * pixels[level - 1]
            peak = max(peak, at(sum(skips) + upsample, 9 * hidden * hidden))
    return int(peak)


def unet_attention_calls(c: dict, latent_h: int, latent_w: int, batch: int, text_tokens: int) -> list[AttentionCall]:
    channels = list(c["block_out_channels"])
    levels = len(channels)
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


def unet(config: ConfigLike, facts: CallFacts, *, latent_scale: int, factor: float) -> WorkingMemory:
    """One UNet2DConditionModel step at `facts`' size (guidance doubles the batch), its walk scaled by the family's
    calibrated `factor`; the cross-attention's key length is the prompt's tokens (CLIP's 77 unless given)."""
    c = config_dict(config)
    batch = facts.batch * (2 if facts.guidance else 1)
    text_tokens = facts.prompt_tokens or CLIP_TOKENS
    latent_h, latent_w = facts.height // latent_scale, facts.width // latent_scale
    item = facts.dtype.itemsize
    activation = unet_peak_bytes(c, latent_h, latent_w, factor * (batch * item), weight_copy_bytes(facts))
    return WorkingMemory(activation, unet_attention_calls(c, latent_h, latent_w, batch, text_tokens))


# --- VAE ----------------------------------------------------------------------------------------------------

# oneDNN's fp32 direct convolutions (PyTorch's CPU path for most of them) work on NCHW tensors in a channel-blocked
# layout whose block is the machine's vector width: 8 channels where AVX2 is the widest ISA oneDNN may use, 16 with
# AVX-512. A layer narrower than a block, or not a multiple of one, is padded up to it, so one model's peak differs
# by machine: the CPU estimate prices the block of the machine it runs on (`cpu_channel_blocks`). Pricing the larger
# block everywhere overestimated an AVX2-only AMD EPYC's VAE encode by up to 1.32x.
ONEDNN_CHANNEL_BLOCKS = (8, 16)
# oneDNN's own cap on the ISA it dispatches to (ONEDNN_MAX_CPU_ISA, formerly DNNL_MAX_CPU_ISA): AVX2 there makes an
# AVX-512 machine block by 8.
ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# PyTorch (ConvParams::use_mkldnn) runs an fp32 3x3 convolution of one image whose input has at most this many
# elements in its own slow_conv2d, which unfolds the input into columns (kernel area x input channels per output
# pixel).
SLOW_CONV_MAX_ELEMENTS = 20480


def cpu_channel_blocks(
    avx512: bool | None = None, avx2: bool | None = None, environ: Mapping[str, str] | None = None
) -> tuple[int, ...]:
    """The channel block(s) oneDNN's fp32 convolutions use on this CPU: 16 where it may use AVX-512, 8 where AVX2 is
    the widest, and both (the estimate takes the worse) where neither is known (an ARM CPU, whose oneDNN runs
    through the Arm Compute Library, is unmeasured). The arguments stand in for the machine in tests."""
    avx512 = torch.cpu._is_avx512_supported() if avx512 is None else avx512
    avx2 = torch.cpu._is_avx2_supported() if avx2 is None else avx2
    environ = os.environ if environ is None else environ
    cap = next((environ[name].strip().upper() for name in ONEDNN_ISA_VARIABLES if environ.get(name, "").strip()), "")
    if avx512 and (not cap or cap.startswith(("AVX512", "AVX10", "AMX", "ALL"))):
        return (16,)
    if avx2 or avx512:
        return (8,)
    return ONEDNN_CHANNEL_BLOCKS


def _padded(channels: int, block: int) -> int:
    return -(-channels // block) * block


@dataclass(frozen=True)
class _Convs:
    """What the VAE's 2-D convolutions allocate beyond their input, for one call's device, dtype and batch."""

    cpu: bool
    fp32: bool
    batch: int
    blocks: tuple[int, ...]  # oneDNN's channel blocks to price (the worse of them)

    @classmethod
    def of(cls, facts: CallFacts) -> _Convs:
        cpu = facts.device.type == "cpu"
        blocks = cpu_channel_blocks() if cpu else ONEDNN_CHANNEL_BLOCKS
        return cls(cpu, facts.dtype == torch.float32, facts.batch, blocks)

    def extra(
        self, c_in: int, c_out: int, p_in: int, p_out: int, *, channels_last: bool = False, kernel: int = 3
    ) -> int:
        """Elements per batch entry at a 3x3 (or 1x1, bounded by the same) convolution's peak, beside its input.

        On CPU: a small one-image input takes slow_conv2d (columns, then the output). A channels-last input runs
        oneDNN's NHWC kernel, which writes the output in place. Otherwise oneDNN reorders the NCHW input into the
        blocked layout (not when it has fewer channels than a block: the kernel then reads NCHW), computes a
        blocked output (channels padded to a block) and reorders that into the NCHW output; measured per op
        (ONEDNN_VERBOSE for the layouts, the resident set for the bytes), the peak is the blocked output beside the
        larger of the other two. 16-bit dtypes (ONEDNN_VERBOSE on an AMX machine: the brgemm kernels take and give
        NHWC) hold an NHWC copy of the input, the NHWC output and its copy into the result at once. Any layout gets
        the weight reordered into oneDNN's blocked layout, on every call (`weight_copy_bytes`), spread over the
        batch here, as every term is per batch entry. The worst over `blocks`; other devices get the
        activation reorders too (unverified)."""
        out = c_out * p_out
        if self.cpu and self.batch == 1 and c_in * p_in <= SLOW_CONV_MAX_ELEMENTS:
            return 9 * c_in * p_out + out
        weights = 0
        if self.cpu:
            blocked = max(_padded(c_out, b) * (_padded(c_in, b) if c_in >= b else c_in) for b in self.blocks)
            weights = -(-blocked * kernel * kernel // self.batch)
        if self.cpu and not self.fp32:
            # oneDNN's 16-bit kernels (AMX, AVX-512 BF16) work channels-last: the NCHW input is copied to NHWC,
            # the kernel writes an NHWC output, and that is copied into the returned tensor while both are alive.
            return c_in * p_in + 2 * out + weights
        if self.cpu and channels_last:
            return out + weights
        worst = 0
        for block in self.blocks:
            blocked_in = _padded(c_in, block) * p_in if c_in >= block else 0
            worst = max(worst, _padded(c_out, block) * p_out + max(blocked_in, out))
        return worst + weights

    def resnet(self, c_in: int, c_out: int, p: int, *, channels_last: bool = False) -> int:
        """Peak elements of a ResnetBlock2D over `p` pixels, beyond what its callers hold: the input stays alive
        throughout (the shortcut reads it) beside, in turn, norm1 and its SiLU, conv1 on that SiLU, norm2 and its
        SiLU, conv2, the 1x1 shortcut when the width changes, and the sum and its scaled copy."""
        cl = channels_last
        changed = c_in != c_out
        steps = [
            3 * c_in * p,
            2 * c_in * p + self.extra(c_in, c_out, p, p, channels_last=cl),
            (c_in + 2 * c_out) * p,
            (c_in + c_out) * p + self.extra(c_out, c_out, p, p, channels_last=cl),
            (c_in + (4 if changed else 3) * c_out) * p,
        ]
        if changed:
            steps.append((c_in + c_out) * p + self.extra(c_in, c_out, p, p, channels_last=cl, kernel=1))
        return max(steps)

    def mid(self, c: dict, channels: int, p: int) -> int:
        """Peak elements of the mid block over the latent pixels: the caller holds its input while the first
        resnet runs on it, then beside the attention (input, group norm, q, k, v, output, projection: 7 C) and the
        second resnet, which runs channels-last when `after_attention` says so."""
        attention = 7 * channels * p if c.get("mid_block_add_attention", True) else 0
        second = self.resnet(channels, channels, p, channels_last=self.after_attention(c))
        return max(self.resnet(channels, channels, p), channels * p + max(attention, second))

    def after_attention(self, c: dict) -> bool:
        """Whether the tensors after the mid block's attention are channels-last: diffusers' attention processor
        reshapes its (B, HW, C) output back to NCHW shape with NHWC strides, PyTorch's CPU group_norm keeps that
        layout for batches of two or more (one image comes back contiguous) and oneDNN's fp32 convolutions keep it.
        Not assumed for 16-bit dtypes: PyTorch runs those through oneDNN only on CPUs with its bf16/fp16 kernels,
        elsewhere through slow_conv2d, whose output is contiguous."""
        return self.cpu and self.fp32 and self.batch > 1 and c.get("mid_block_add_attention", True)


def _vae_attention(c: dict, facts: CallFacts) -> list[AttentionCall]:
    if not c.get("mid_block_add_attention", True):
        return []
    channels = list(c["block_out_channels"])
    scale = 2 ** (len(channels) - 1)
    tokens = (facts.height // scale) * (facts.width // scale)
    return [AttentionCall(num_heads=facts.batch, query_len=tokens, key_len=tokens, head_dim=channels[-1])]


def vae_decode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    channels = list(reversed(c["block_out_channels"]))
    levels = len(channels)
    layers = c.get("layers_per_block", 2) + 1  # decoder blocks have one resnet more than encoder blocks
    h, w = facts.height // 2 ** (levels - 1), facts.width // 2 ** (levels - 1)
    item = facts.dtype.itemsize
    # Nearest upsampling runs in fp32 for bf16 inputs (diffusers' Upsample2D): a copy of the input, the upsampled
    # tensor in fp32, then its cast back.
    upcast = facts.dtype == torch.bfloat16
    f32 = fp32_bytes(facts.dtype)
    convs = _Convs.of(facts)
    cl = convs.after_attention(c)
    latent = c["latent_channels"]
    p = h * w
    base = latent * p  # post_quant_conv's output, held by AutoencoderKL until the decoder returns
    hidden = channels[0]
    # post_quant_conv (1x1), then conv_in
    peak = base + max(convs.extra(latent, latent, p, p, kernel=1), convs.extra(latent, hidden, p, p))
    peak = max(peak, base + convs.mid(c, hidden, p)) * item
    for k, out in enumerate(channels):
        p = h * w
        block_in = hidden * p  # held by the decoder while the block runs
        for j in range(layers):
            held = base + (block_in if j else 0)
            peak = max(peak, (held + convs.resnet(hidden, out, p, channels_last=cl)) * item)
            hidden = out
        if k < levels - 1:
            h, w = 2 * h, 2 * w
            up = hidden * h * w
            held = (base + block_in + hidden * p) * item  # and the upsampler's input
            if upcast:
                peak = max(peak, held + hidden * p * f32 + up * f32, held + up * (f32 + item))
            peak = max(peak, held + (up + convs.extra(hidden, hidden, h * w, h * w, channels_last=cl)) * item)
    # norm_out, then its SiLU, then conv_out at full resolution
    p = h * w
    head = max(2 * hidden * p, hidden * p + convs.extra(hidden, c.get("out_channels", 3), p, p, channels_last=cl))
    peak = max(peak, (base + head) * item)
    activation = int(VAE_FACTOR["vae_decode"] * (facts.batch * peak))
    return WorkingMemory(activation, _vae_attention(c, facts))


def vae_encode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    channels = list(c["block_out_channels"])
    levels = len(channels)
    layers = c.get("layers_per_block", 2)
    convs = _Convs.of(facts)
    h, w = facts.height, facts.width
    hidden = channels[0]
    peak = convs.extra(c.get("in_channels", 3), hidden, h * w, h * w)  # conv_in (the image is an input)
    for k, out in enumerate(channels):
        p = h * w
        block_in = hidden * p  # held by the encoder while the block runs
        for j in range(layers):
            peak = max(peak, (block_in if j else 0) + convs.resnet(hidden, out, p))
            hidden = out
        if k < levels - 1:
            # Downsample2D pads asymmetrically (a full copy) before its stride-2 conv, beside the block's input
            # and its own.
            padded = (h + 1) * (w + 1)
            h, w = h // 2, w // 2
            peak = max(peak, block_in + hidden * (p + padded) + convs.extra(hidden, hidden, padded, h * w))
    p = h * w
    peak = max(peak, convs.mid(c, hidden, p))
    # norm_out, its SiLU and conv_out to the moments (2 x latent channels), then quant_conv and the posterior's
    # clamped log-variance, std and var beside the moments.
    moments = 2 * c["latent_channels"]
    peak = max(peak, 2 * hidden * p, hidden * p + convs.extra(hidden, moments, p, p))
    peak = max(peak, moments * p + max(convs.extra(moments, moments, p, p, kernel=1), 3 * moments // 2 * p))
    activation = int(VAE_FACTOR["vae_encode"] * (facts.batch * peak * facts.dtype.itemsize))
    return WorkingMemory(activation, _vae_attention(c, facts))
