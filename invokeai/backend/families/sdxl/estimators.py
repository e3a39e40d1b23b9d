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
The factors scale the walks to what `scripts/calibrate_working_memory.py` measured on CPU for demo-sdxl, so the
estimate lies between 1.0 and 1.3 times the measurement. The VAE is SD-1's architecture and keeps the walk's own
factors (calibrated on SD-1's demo), with 5% more for decode and 3% for encode: with the walk's alone it measured too
close to 1.0 on one CPU. Calibration figures: docs/families.md, "Calibration".
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
