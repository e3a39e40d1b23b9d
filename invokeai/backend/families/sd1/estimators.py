"""Working memory of Stable Diffusion 1.x components: CLIP text encoder, UNet (one denoise step), VAE decode/encode.

SD-1's components are the CLIP text encoder, UNet2DConditionModel and AutoencoderKL that
`invokeai.backend.cache.clip_unet_vae` walks (its docstring gives every term, the attention calls and how the
walks were calibrated on this family's demo model). What is SD-1's own: its latent scale (8), CLIP's 77 tokens and
the factors below, calibrated on CPU with `scripts/calibrate_working_memory.py` (peak live bytes, fp32, 64-256 px,
batches raised to 8 MiB) so that the estimate lies between 1.0 and 1.3 times the measurement; at full size
(`--full-size`: the shipped config, 256 and 512 px) the estimates are 1.05-1.14 times the measured peak (the table
is in docs/api.md, "Memory"). The VAE keeps the walk's own factors (decode x 1.07, encode x 1.05).
"""

from __future__ import annotations

from invokeai.backend.cache import clip_unet_vae
from invokeai.backend.cache.estimate import CallFacts, ConfigLike, WorkingMemory
from invokeai.backend.families.sd1.constants import LATENT_SCALE

# Calibrated on CPU (see the module docstring); the walk, not these, carries the scaling with size and batch.
ACTIVATION_FACTOR = {
    "text_encoder": 1.0,
    "unet": 1.35,
    **clip_unet_vae.VAE_FACTOR,
}


def text_encoder(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return clip_unet_vae.clip_text_encoder(config, facts, ACTIVATION_FACTOR["text_encoder"])


def unet(config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return clip_unet_vae.unet(config, facts, latent_scale=LATENT_SCALE, factor=ACTIVATION_FACTOR["unet"])


vae_decode = clip_unet_vae.vae_decode
vae_encode = clip_unet_vae.vae_encode

ESTIMATORS = {
    "text_encoder": text_encoder,
    "unet": unet,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
