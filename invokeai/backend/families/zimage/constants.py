"""Z-Image's name and the numbers its generation code, estimators, runs and nodes share (diffusers' ZImagePipeline
sets them)."""

from __future__ import annotations

from invokeai.backend.families.family import Constants

NAME = "z-image"
LATENT_SCALE = 8  # FLUX.1's AutoencoderKL: three stride-2 downsamplings
LATENT_CHANNELS = 16
PATCH = 2  # the transformer's all_patch_size: 2x2 latent cells per image token
SIZE_MULTIPLE = LATENT_SCALE * PATCH
TEXT_TOKENS = 512  # ZImagePipeline's max_sequence_length: the chat-templated prompt is padded (or cut) to it
# The transformer pads every caption and every image to a multiple of this many tokens (diffusers' SEQ_MULTI_OF),
# repeating the last token; a CFG batch whose padded captions differ in length gets an attention mask.
SEQUENCE_MULTIPLE = 32
# Tokens of the chat template around an empty prompt ("<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n" in
# Qwen3's tokenizer): what the pipeline's default negative prompt "" conditions on.
EMPTY_PROMPT_TOKENS = 8
HIDDEN_STATE = -2  # the pipeline conditions on the text encoder's second-to-last hidden state
TIMESTEP_SCALE = 1000  # the transformer gets (1000 - t) / 1000: 0 is pure noise, 1 the clean image

# FlowMatchEulerDiscreteScheduler's defaults for the resolution-dependent shift, as ZImagePipeline reads them (it
# passes mu whatever the config says; only a config with use_dynamic_shifting uses it).
SHIFT_DEFAULTS = {"base_image_seq_len": 256, "max_image_seq_len": 4096, "base_shift": 0.5, "max_shift": 1.15}

# Recommended settings, in InvokeAI's CFG convention (see generation.denoise: 1 means no guidance; diffusers'
# guidance_scale is this minus one).
TURBO_STEPS, TURBO_CFG = 9, 1.0
BASE_STEPS, BASE_CFG = 50, 4.0

CONSTANTS = Constants(
    latent_scale=LATENT_SCALE,
    latent_channels=LATENT_CHANNELS,
    size_multiple=SIZE_MULTIPLE,
    text_lengths={"text_encoder": TEXT_TOKENS},
)


def padded(tokens: int) -> int:
    """A caption or image sequence's length inside the transformer: rounded up to SEQUENCE_MULTIPLE."""
    return -(-tokens // SEQUENCE_MULTIPLE) * SEQUENCE_MULTIPLE
