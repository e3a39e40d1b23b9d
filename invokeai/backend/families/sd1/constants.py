"""Stable Diffusion 1.x's name and the numbers its generation code, estimators, runs and nodes share."""

from invokeai.backend.families.family import Constants

NAME = "sd-1"
# Four VAE blocks: 8 pixels a latent, 4 channels; CLIP pads every prompt to its 77-token context.
CONSTANTS = Constants(latent_scale=8, latent_channels=4, size_multiple=8, text_lengths={"text_encoder": 77})
LATENT_SCALE = CONSTANTS.latent_scale
CLIP_TOKENS = CONSTANTS.text_lengths["text_encoder"]
