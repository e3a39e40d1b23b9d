"""Krea-2's name and the numbers its generation code, estimators, runs and nodes share."""

from invokeai.backend.families.family import Constants

NAME = "krea2"
# The Qwen-Image VAE (f8, 16 channels) times the transformer's 2x2 patches; Krea2Pipeline pads prompts to 512 tokens
# inside its chat template, whose 34-token system prefix it drops after the text model.
PATCH = 2
CONSTANTS = Constants(latent_scale=8, latent_channels=16, size_multiple=8 * PATCH, text_lengths={"text_encoder": 512})
LATENT_SCALE = CONSTANTS.latent_scale
PROMPT_TOKENS = CONSTANTS.text_lengths["text_encoder"]
TEMPLATE_PREFIX_TOKENS = 34
TEMPLATE_SUFFIX_TOKENS = 5
# The Qwen-Image chat template Krea-2 was trained with (diffusers' Krea2Pipeline sets it in __init__, not in its
# config). The prompt is padded to a fixed length *inside* the template, the assistant suffix follows the padding,
# and the system prefix is cut from the encoder output, so a tokenizer must encode the prefix and suffix to exactly
# TEMPLATE_PREFIX_TOKENS and TEMPLATE_SUFFIX_TOKENS tokens.
PROMPT_PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"
)
PROMPT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
