"""Stable Diffusion 1.x nodes: prompt -> conditioning, conditioning (+ latents) -> latents, latents <-> image.

Each node resolves its model, reserves working memory for its call and runs `invokeai.backend.generation.sd1`, which
computes what diffusers' StableDiffusion(Img2Img)Pipeline computes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from invokeai.app.nodes.base import BaseInvocation, ImageField, InputField, InvocationContext
from invokeai.app.nodes.image import MAX_DIMENSION, ImageOutput
from invokeai.app.nodes.model_fields import (
    SEED_MAX,
    ConditioningField,
    ConditioningOutput,
    LatentsField,
    LatentsOutput,
    ModelIdentifier,
    ModelInputField,
)
from invokeai.app.nodes.model_use import (
    TensorKind,
    decode_latents,
    encode_image,
    family_model,
    latents_output,
    start_latents,
    step_reporter,
)
from invokeai.backend.families.sd1.constants import LATENT_SCALE, NAME
from invokeai.backend.families.sd1.descriptor import FAMILY as SD1
from invokeai.backend.families.sd_schedulers import SDSchedulerName

FAMILY = NAME

CONDITIONING = TensorKind("conditioning", ("sd1_clip_embeds",), "sd_text_encoder")
LATENTS = TensorKind("latents", ("sd1_latents",), "sd_denoise or sd_vae_encode")

MODEL_DESCRIPTION = "The SD-1 model"


class SDTextEncoderInvocation(BaseInvocation):
    """A prompt encoded by the model's CLIP text encoder, for sd_denoise's positive or negative conditioning."""

    type: Literal["sd_text_encoder"] = "sd_text_encoder"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    prompt: str = InputField(default="", description="The prompt")

    def invoke(self, context: InvocationContext) -> ConditioningOutput:
        from invokeai.backend.families.sd1 import generation as sd1

        record = family_model(context, self.model, FAMILY)
        tokenizer = context.models.load(record, "tokenizer")
        with context.models.on_device(record, "text_encoder") as text_encoder:
            embeds = sd1.encode_prompt(text_encoder, tokenizer, self.prompt, context.models.device)
        return ConditioningOutput(conditioning=ConditioningField(conditioning_name=CONDITIONING.save(context, embeds)))


class SDDenoiseInvocation(BaseInvocation):
    """Latents denoised by the model's UNet: from noise (text-to-image), or from `latents` (image-to-image), starting
    `denoising_strength` of the way into the schedule. Reports every step with a small preview."""

    type: Literal["sd_denoise"] = "sd_denoise"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    positive_conditioning: ConditioningField = InputField(description="What the image shows (sd_text_encoder)")
    negative_conditioning: ConditioningField | None = InputField(
        default=None, description="What the image avoids (sd_text_encoder); needed when cfg_scale > 1"
    )
    latents: LatentsField | None = InputField(
        default=None, description="Latents to start from (sd_vae_encode), for image-to-image; their size must match"
    )
    denoising_strength: float = InputField(
        default=1.0, ge=0.0, le=1.0, description="With latents: how much of the schedule to run (1: all of it)"
    )
    width: int = InputField(default=512, ge=LATENT_SCALE, le=MAX_DIMENSION, description="The width, a multiple of 8")
    height: int = InputField(default=512, ge=LATENT_SCALE, le=MAX_DIMENSION, description="The height, a multiple of 8")
    steps: int = InputField(default=30, ge=1, le=1000, description="The number of denoising steps")
    cfg_scale: float = InputField(default=7.5, ge=1.0, le=100.0, description="Classifier-free guidance; 1 turns it off")
    scheduler: SDSchedulerName = InputField(default="euler", description="The sampler (docs/api.md, Schedulers)")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the noise")

    @field_validator("width", "height")
    @classmethod
    def _multiple_of_8(cls, value: int) -> int:
        if value % LATENT_SCALE:
            raise ValueError(f"must be a multiple of {LATENT_SCALE}, got {value}")
        return value

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        from invokeai.backend.families.sd1 import generation as sd1

        record = family_model(context, self.model, FAMILY)
        (positive,) = CONDITIONING.load(context, self.positive_conditioning.conditioning_name)
        guided = self.cfg_scale > 1.0
        if guided and self.negative_conditioning is None:
            raise ValueError('cfg_scale > 1 needs negative_conditioning (encode the negative prompt, or "")')
        # Without guidance the negative conditioning is never read; the positive one fills its place.
        negative = positive
        if guided and self.negative_conditioning is not None:
            (negative,) = CONDITIONING.load(context, self.negative_conditioning.conditioning_name)
        init_latents = None
        if self.latents is not None:
            init_latents = start_latents(context, record, LATENTS, self.latents.latents_name, self.width, self.height)
        base = context.models.load(record, "scheduler")
        scheduler = SD1.make_scheduler(self.scheduler, dict(base.config))

        with context.models.on_device(record, "unet", width=self.width, height=self.height, guidance=guided) as unet:
            latents = sd1.denoise(
                unet,
                scheduler,
                positive=positive,
                negative=negative,
                width=self.width,
                height=self.height,
                steps=self.steps,
                cfg_scale=self.cfg_scale,
                seed=self.seed,
                device=context.models.device,
                dtype=context.models.dtype,
                init_latents=init_latents,
                strength=self.denoising_strength,
                on_step=step_reporter(context, sd1.LATENT_RGB),
            )
        return latents_output(context, LATENTS, latents, self.width, self.height)


class SDVaeDecodeInvocation(BaseInvocation):
    """The image the model's VAE decodes from latents."""

    type: Literal["sd_vae_decode"] = "sd_vae_decode"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    latents: LatentsField = InputField(description="The latents to decode (sd_denoise)")

    def invoke(self, context: InvocationContext) -> ImageOutput:
        from invokeai.backend.families.sd1 import generation as sd1

        record = family_model(context, self.model, FAMILY)
        return decode_latents(context, record, LATENTS, self.latents.latents_name, sd1.vae_decode)


class SDVaeEncodeInvocation(BaseInvocation):
    """Latents of an image, sampled from the model's VAE posterior, for image-to-image with sd_denoise. Give
    sd_denoise the same seed to get the image StableDiffusionImg2ImgPipeline makes with that seed."""

    type: Literal["sd_vae_encode"] = "sd_vae_encode"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    image: ImageField = InputField(description="The image; its sides must be multiples of 8")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the posterior sample")

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        from invokeai.backend.families.sd1 import generation as sd1

        record = family_model(context, self.model, FAMILY)
        return encode_image(context, record, LATENTS, self.image, self.seed, sd1.vae_encode)
