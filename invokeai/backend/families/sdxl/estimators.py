"""Working memory of SDXL components: both CLIP text encoders, the UNet (one denoise step), VAE decode/encode.

SDXL's components are the CLIP text encoders, UNet2DConditionModel and AutoencoderKL that
`invokeai.backend.cache.clip_unet_vae` walks (its docstring gives each term); what differs is read off the configs:
- Text encoders: the pipeline asks for every layer's hidden states (it conditions on the penultimate one), so all
  `num_hidden_layers + 1` of them stay alive beside the layer that runs; one causal self-attention per layer over
  the 77 padded tokens, no mask. CLIPTextModel (ViT-L) and CLIPTextModelWithProjection (bigG) alike, but bigG's
  exact GELU holds one temporary beside fc1's output where ViT-L's quick_gelu holds three.
- UNet: per-level head counts (`attention_head_dim` is SDXL's head count per block, diffusers' legacy naming:
  5/10/20 heads of 64), `transformer_layers_per_block` (1/2/10 BasicTransformerBlocks, each one self- and one
  cross-attention over 77 tokens of the two encoders' concatenated states), no attention in the first level, the
  mid block's depth, linear proj_in/proj_out (their weights are counted as the 1x1 convolutions SD-1 has), and the
  text_time add embedding (a few kilobytes). Guidance doubles the batch.
- VAE: the AutoencoderKL walk. An fp16 VAE whose config sets force_upcast decodes in fp32 (the pipeline upcasts
  it, and so does `generation.vae_decode`); encoding upcasts any 16-bit VAE with force_upcast. Upcast calls are
  priced at fp32, plus the fp32 copy of the weights the in-place upcast allocates (2 bytes more per parameter than
  the fp16 ones it replaces, counted from the config).
The factors scale the walks to what `scripts/calibrate_working_memory.py` measured on CPU for demo-sdxl (peak live
bytes, fp32, 64-256 px, batches raised to 8 MiB) so the estimate lies between 1.0 and 1.3 times the measurement:
text encoder 1.17, text_encoder_2 1.12-1.13, UNet 1.21-1.23, VAE decode 1.10-1.12, encode 1.09-1.11 (2-core
Xeon with AVX-512 and AMX, torch 2.13.0). The VAE is SD-1's architecture and keeps the walk's own factors
(calibrated on SD-1's demo), with 5% more for decode and 3% for encode: with those alone the same demo VAE measured
1.02-1.07 from run to run there, too close to 1.0; on a 2-core AMD EPYC (torch 2.13.0, transformers 5.25) encode
measured 1.31 with 5% more at 128 px and batch 3, over the 1.3 bound, and 1.25-1.28 at 64-256 px with 3%.
The same formulas at full size (`scripts/calibrate_working_memory.py --full-size sdxl`: the shipped configs/sdxl,
random fp16 weights loaded in fp32; the demo models are too small to show the weight copies and GEMM buffers that
count there), estimate / measured MiB:

| Operation | Size | Estimate | Measured | Ratio |
|---|---|---|---|---|
| UNet (batch 2: guidance) | 256 px | 131.6 | 130.3 | 1.01 |
| UNet (batch 2: guidance) | 512 px | 190.5 | 181.4 | 1.05 |
| text_encoder (CLIP ViT-L, 2 prompts) | 77 tokens | 12.9 | 11.7 | 1.10 |
| text_encoder_2 (OpenCLIP bigG) | 77 tokens | 17.4 | 15.8 | 1.10 |

At 256 px most of the UNet's figure is the copy oneDNN makes of its widest convolution's weight (up_blocks.0's
first conv1, 2560 to 1280 channels: 112.5 MiB in fp32) on each call. On CUDA the formulas are unverified.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import replace

import torch

from invokeai.backend.cache import clip_unet_vae
from invokeai.backend.cache.estimate import AttentionCall, CallFacts, ConfigLike, WorkingMemory, config_dict

from .constants import CLIP_TOKENS, LATENT_SCALE

# Calibrated on CPU (see the module docstring); the walks, not these, carry the scaling with size and batch.
ACTIVATION_FACTOR = {
    "text_encoder": 0.95,
    # A full-size bigG pass at one prompt holds a few MiB beyond the walk (GEMM buffers, it seems).
    "text_encoder_2": 1.1,
    "unet": 1.0,
}
# Multiplies the AutoencoderKL walk, its factor included (see the module docstring).
VAE_MARGIN = {"vae_decode": 1.05, "vae_encode": 1.03}
# fc1-output-sized tensors alive at the text encoder MLP's peak: quick_gelu (CLIP ViT-L) keeps fc1's output, its
# scaled input, sigmoid and product; the exact GELU (OpenCLIP bigG) is one kernel beside fc1's output.
_MLP_TEMPORARIES = {"quick_gelu": 4, "gelu": 2}


# --- text encoders ------------------------------------------------------------------------------------------


def _text(operation: str, config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    tokens = facts.prompt_tokens or c.get("max_position_embeddings", CLIP_TOKENS)
    hidden, inner, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    layers = c["num_hidden_layers"]
    # Per token: the hidden states kept so far (every layer's output, output_hidden_states=True), the layer norm's
    # output, then either q/k/v/attention output or the MLP's fc1 output and its activation's temporaries.
    mlp = _MLP_TEMPORARIES.get(c.get("hidden_act", "quick_gelu"), 4) * inner
    per_token = (layers + 2) * hidden + max(6 * hidden, mlp)
    activation = int(ACTIVATION_FACTOR[operation] * facts.batch * tokens * per_token * facts.dtype.itemsize)
    calls = [
        AttentionCall(
            num_heads=facts.batch * heads,
            query_len=tokens,
            key_len=tokens,
            head_dim=hidden // heads,
            is_causal=True,
            count=layers,
        )
    ]
    return WorkingMemory(activation, calls)


def text_encoder(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return _text("text_encoder", config, facts)


def text_encoder_2(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return _text("text_encoder_2", config, facts)


# --- UNet ---------------------------------------------------------------------------------------------------


def unet(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return clip_unet_vae.unet(config, facts, latent_scale=LATENT_SCALE, factor=ACTIVATION_FACTOR["unet"])


# --- VAE ----------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _vae_parameters(config_json: str) -> int:
    """Parameters of the AutoencoderKL a config describes, counted on the meta device (no memory, no weights)."""
    from diffusers import AutoencoderKL

    with torch.device("meta"):
        model = AutoencoderKL.from_config(json.loads(config_json))
    return sum(p.numel() for p in model.parameters())


def _priced(operation: str, c: dict, facts: CallFacts, upcasts: bool) -> WorkingMemory:
    """The AutoencoderKL walk for `operation` as the call runs: in fp32 beside the fp32 weights an in-place upcast
    allocates, when it upcasts."""
    walk: Callable[[ConfigLike, CallFacts], WorkingMemory] = getattr(clip_unet_vae, operation)
    memory = walk(c, replace(facts, dtype=torch.float32) if upcasts else facts)
    activation = int(memory.activation_bytes * VAE_MARGIN[operation])
    if upcasts:
        keys = {k: v for k, v in c.items() if not k.startswith("_")}
        activation += (4 - facts.dtype.itemsize) * _vae_parameters(json.dumps(keys, sort_keys=True, default=list))
    return WorkingMemory(activation, memory.attention_calls)


def vae_decode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    upcasts = facts.dtype == torch.float16 and bool(c.get("force_upcast", False))
    return _priced("vae_decode", c, facts, upcasts)


def vae_encode(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    c = config_dict(config)
    upcasts = facts.dtype != torch.float32 and bool(c.get("force_upcast", False))
    return _priced("vae_encode", c, facts, upcasts)


ESTIMATORS = {
    "text_encoder": text_encoder,
    "text_encoder_2": text_encoder_2,
    "unet": unet,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
