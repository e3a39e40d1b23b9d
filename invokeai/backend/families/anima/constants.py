"""Anima's name and the numbers its generation code, estimators, runs and nodes share (diffusers'
AnimaModularPipeline sets them)."""

from __future__ import annotations

from invokeai.backend.families.family import Constants

NAME = "anima"
LATENT_SCALE = 8  # the Qwen-Image VAE: three stride-2 downsamplings
LATENT_CHANNELS = 16
PATCH = 2  # the Cosmos DiT patches 1 x 2 x 2 latent cells into one token
SIZE_MULTIPLE = LATENT_SCALE * PATCH
# The tokenizers keep at most this many tokens of a prompt (the pipeline's max_sequence_length), and the adapter pads
# its output to at least this many (AnimaTextConditioner's min_sequence_length): the DiT always cross-attends to 512.
MAX_SEQUENCE_LENGTH = 512
CONDITIONING_TOKENS = 512

# InvokeAI's anima_denoise defaults (its node: 30 steps, CFG 4.5, 1024 x 1024, euler) and the recommended steps its
# records carry (35).
STEPS = 30
RECOMMENDED_STEPS = 35
GUIDANCE_SCALE = 4.5
SIDE = 1024

CONSTANTS = Constants(
    latent_scale=LATENT_SCALE,
    latent_channels=LATENT_CHANNELS,
    size_multiple=SIZE_MULTIPLE,
    text_lengths={"text_encoder": MAX_SEQUENCE_LENGTH, "text_conditioner": CONDITIONING_TOKENS},
)
