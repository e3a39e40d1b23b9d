"""Numbers SDXL's generation code, estimators, calibration runs and nodes share."""

from __future__ import annotations

from invokeai.backend.families.family import Constants

FAMILY_NAME = "sdxl"
PIPELINE_CLASS = "StableDiffusionXLPipeline"
IMG2IMG_PIPELINE_CLASS = "StableDiffusionXLImg2ImgPipeline"

# The SDXL VAE downsamples by 8 (four blocks, as SD-1's) into 4 latent channels.
LATENT_SCALE = 8
LATENT_CHANNELS = 4
SIZE_MULTIPLE = 8
# Both CLIP tokenizers pad every prompt to CLIP's full context; the UNet attends over those 77 tokens.
CLIP_TOKENS = 77
TEXT_LENGTHS = {"text_encoder": CLIP_TOKENS, "text_encoder_2": CLIP_TOKENS}
CONSTANTS = Constants(
    latent_scale=LATENT_SCALE, latent_channels=LATENT_CHANNELS, size_multiple=SIZE_MULTIPLE, text_lengths=TEXT_LENGTHS
)

COMPONENTS = ("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "unet", "vae", "scheduler")
MODULE_COMPONENTS = ("text_encoder", "text_encoder_2", "unet", "vae")
# Estimator operation -> the component it runs.
OPERATIONS = {
    "text_encoder": "text_encoder",
    "text_encoder_2": "text_encoder_2",
    "unet": "unet",
    "vae_decode": "vae",
    "vae_encode": "vae",
}
