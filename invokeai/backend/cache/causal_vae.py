"""Working memory of diffusers' AutoencoderKLQwenImage (Wan-2.1's causal video VAE) coding one image as one frame:
the decode and encode walks every family on this VAE prices its `vae_decode` and `vae_encode` with, each passing its
latent scale.

A walk follows the coder block by block and keeps, beside each step's working set, the one-frame clone every causal
3-D convolution stores in its feature cache (alive until the coding ends; a temporal downsample caches its whole
output on the first frame). A residual block's causal convolutions pad their input to three frames (two zero frames
in front) and may copy it again: 27 times in PyTorch's CPU slow_conv3d (one fp32 image, and every 16-bit batch), 3
in oneDNN's blocked layout (fp32 batches), 0 on CUDA. The decoder's upsampling runs in fp32. The mid block's single
head attends over the deepest level's pixels, one call per image, as wide as that level.

The factors scale the structural bytes to what `scripts/calibrate_working_memory.py` measured on CPU (peak live
bytes, fp32) for the demo VAEs (base_dim 8, dim_mult [1, 2, 2, 2], one residual block a level) at 64-256 px, so the
estimate lies between 1.0 and 1.3 times the measurement. On CUDA the same formulas apply, unverified there until the
script is run on a GPU.
"""

from __future__ import annotations

import torch

from invokeai.backend.cache.estimate import AttentionCall, CallFacts, ConfigLike, WorkingMemory, config_dict, fp32_bytes

FACTOR = {"vae_decode": 1.15, "vae_encode": 1.1}
ATTENTION_PER_PIXEL = 10  # the mid attention's norm, qkv and its contiguous copy, output, reshaped copy, projection


def conv3d_input_copies(facts: CallFacts) -> int:
    """Extra copies of a 3x3x3 conv3d's padded input, per input channel and output pixel. PyTorch's CPU slow_conv3d
    (one fp32 image, and every 16-bit batch) unfolds it into a 27-times buffer; oneDNN (fp32 batches) reorders the
    three padded frames into its blocked layout. CUDA's kernels need neither."""
    if facts.device.type != "cpu":
        return 0
    return 27 if facts.batch == 1 or facts.dtype != torch.float32 else 3


def causal_resnet(c_in: int, c_out: int, copies: int) -> tuple[int, int]:
    """(peak elements per pixel, elements per pixel left in the feature cache) of a QwenImageResidualBlock on one
    frame: each causal conv pads its input to three frames (two zero frames in front), caches a clone of it, and
    may copy it `copies` more times (see conv3d_input_copies)."""
    shortcut = c_out
    first = shortcut + 2 * c_in + (3 + copies) * c_in + c_out
    second = shortcut + 2 * c_out + (3 + copies) * c_out + c_out
    return max(first, second), c_in + c_out


def _mid_attention(facts: CallFacts, pixels: int, width: int) -> AttentionCall:
    return AttentionCall(num_heads=facts.batch, query_len=pixels, key_len=pixels, head_dim=width)


def vae_decode(config: ConfigLike, facts: CallFacts, latent_scale: int) -> WorkingMemory:
    c = config_dict(config)
    base, mult = c["base_dim"], list(c["dim_mult"])
    dims = [base * m for m in [mult[-1], *reversed(mult)]]
    item, f32 = facts.dtype.itemsize, fp32_bytes(facts.dtype)
    h, w = facts.height // latent_scale, facts.width // latent_scale
    pixels = h * w
    copies = conv3d_input_copies(facts)
    # Elements per batch entry: what the feature cache holds so far, and the peak of cache plus working set.
    cache = c["z_dim"] * pixels  # conv_in's clone of the latent frame
    resnet_peak, cached = causal_resnet(dims[0], dims[0], copies)
    peak = cache + resnet_peak * pixels
    cache += 2 * cached * pixels  # the mid block's two resnets
    peak = max(peak, cache + ATTENTION_PER_PIXEL * dims[0] * pixels)
    hidden = dims[0]
    blocks = len(mult)
    for i in range(blocks):
        for _ in range(c["num_res_blocks"] + 1):
            resnet_peak, cached = causal_resnet(hidden, dims[i + 1], copies)
            peak = max(peak, cache + resnet_peak * pixels)
            cache += cached * pixels
            hidden = dims[i + 1]
        if i < blocks - 1:
            # QwenImageUpsample interpolates in fp32 and casts back, then a 3x3 conv halves the channels.
            upcast = hidden * 4 * pixels * (f32 + (item if item != f32 else 0)) // item
            peak = max(peak, cache + hidden * pixels + upcast + hidden // 2 * 4 * pixels)
            pixels, hidden = 4 * pixels, hidden // 2
    # Head: norm, activation, the padded copy (and its copies) and conv_out's output, beside the block output.
    peak = max(peak, cache + ((6 + copies) * hidden + c.get("input_channels", 3)) * pixels)
    activation = int(FACTOR["vae_decode"] * facts.batch * peak * item)
    return WorkingMemory(activation, [_mid_attention(facts, h * w, dims[0])])


def vae_encode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    base, mult = c["base_dim"], list(c["dim_mult"])
    dims = [base * m for m in [1, *mult]]
    temporal = list(c.get("temperal_downsample", [False, True, True]))
    z2 = 2 * c["z_dim"]  # the encoder's output: mean and log-variance
    channels = c.get("input_channels", 3)
    item = facts.dtype.itemsize
    height, width = facts.height, facts.width
    pixels = height * width
    copies = conv3d_input_copies(facts)
    # conv_in caches a clone of the image frame and pads it to three frames (and may copy those).
    cache = channels * pixels
    peak = cache + ((3 + copies) * channels + dims[0]) * pixels
    hidden = dims[0]
    blocks = len(mult)
    for i in range(blocks):
        for _ in range(c["num_res_blocks"]):
            resnet_peak, cached = causal_resnet(hidden, dims[i + 1], copies)
            peak = max(peak, cache + resnet_peak * pixels)
            cache += cached * pixels
            hidden = dims[i + 1]
        if i < blocks - 1:
            # A zero-padded copy and a stride-2 3x3 conv beside its input; a temporal downsample caches its output.
            height, width = (height + 1 - 3) // 2 + 1, (width + 1 - 3) // 2 + 1
            smaller = height * width
            peak = max(peak, cache + 2 * hidden * pixels + 2 * hidden * smaller)
            pixels = smaller
            if temporal[i]:
                cache += hidden * pixels
    # Mid block: resnet, single-head attention, resnet.
    resnet_peak, cached = causal_resnet(hidden, hidden, copies)
    peak = max(peak, cache + resnet_peak * pixels)
    cache += cached * pixels
    peak = max(peak, cache + ATTENTION_PER_PIXEL * hidden * pixels)
    peak = max(peak, cache + resnet_peak * pixels)
    cache += cached * pixels
    # Head (norm, activation, padded copy, conv_out), then quant_conv and the posterior's mean, std and variance.
    peak = max(peak, cache + ((6 + copies) * hidden + z2) * pixels, cache + 4 * z2 * pixels)
    activation = int(FACTOR["vae_encode"] * facts.batch * peak * item)
    return WorkingMemory(activation, [_mid_attention(facts, pixels, hidden)])
