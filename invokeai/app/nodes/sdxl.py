"""Stable Diffusion XL nodes: prompts -> conditioning, conditioning (+ latents) -> latents, latents <-> image.

Each node resolves its model, gets its component on the device with the working memory for its call reserved, and
runs `invokeai.backend.families.sdxl.generation`, which computes what diffusers' StableDiffusionXL(Img2Img)Pipeline
computes for a base model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

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
from invokeai.backend.families.sd_schedulers import SDSchedulerName
from invokeai.backend.families.sdxl.constants import FAMILY_NAME, LATENT_SCALE
from invokeai.backend.families.sdxl.descriptor import FAMILY as SDXL

if TYPE_CHECKING:
    from invokeai.app.services.model_records import ModelRecord
    from invokeai.backend.families.sdxl.generation import SdxlConditioning

FAMILY = FAMILY_NAME

CONDITIONING = TensorKind("conditioning", ("sdxl_embeds", "sdxl_pooled"), "sdxl_text_encoder")
LATENTS = TensorKind("latents", ("sdxl_latents",), "sdxl_denoise or sdxl_vae_encode")

MODEL_DESCRIPTION = "The SDXL model"


class SDXLTextEncoderInvocation(BaseInvocation):
    """A prompt encoded by both of the model's CLIP text encoders (penultimate hidden states side by side, and the
    second encoder's pooled projection), for sdxl_denoise's positive or negative conditioning."""

    type: Literal["sdxl_text_encoder"] = "sdxl_text_encoder"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    prompt: str = InputField(default="", description="The prompt (the first text encoder's, CLIP ViT-L)")
    prompt_2: str | None = InputField(
        default=None, description="The second text encoder's prompt (OpenCLIP ViT-bigG); unset: the same prompt"
    )

    def invoke(self, context: InvocationContext) -> ConditioningOutput:
        record = family_model(context, self.model, FAMILY)
        conditioning = _encode(context, record, self.prompt, self.prompt_2)
        name = CONDITIONING.save(context, conditioning.embeds, conditioning.pooled)
        return ConditioningOutput(conditioning=ConditioningField(conditioning_name=name))


def _encode(context: InvocationContext, record: ModelRecord, prompt: str, prompt_2: str | None) -> SdxlConditioning:
    """Both text encoders' conditioning for a prompt, each encoder on the device in turn."""
    from invokeai.backend.families.sdxl import generation

    device = context.models.device
    tokenizer = context.models.load(record, "tokenizer")
    tokenizer_2 = context.models.load(record, "tokenizer_2")
    with context.models.on_device(record, "text_encoder") as text_encoder:
        first = generation.encode_with(text_encoder, tokenizer, prompt, device)
    with context.models.on_device(record, "text_encoder_2") as text_encoder_2:
        second = generation.encode_with(text_encoder_2, tokenizer_2, prompt_2 or prompt, device)
        return generation.join(first, second, text_encoder_2.dtype, device)


class SDXLDenoiseInvocation(BaseInvocation):
    """Latents denoised by the model's UNet: from noise (text-to-image), or from `latents` (image-to-image), starting
    `denoising_strength` of the way into the schedule. Reports every step with a small preview."""

    type: Literal["sdxl_denoise"] = "sdxl_denoise"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    positive_conditioning: ConditioningField = InputField(description="What the image shows (sdxl_text_encoder)")
    negative_conditioning: ConditioningField | None = InputField(
        default=None,
        description="What the image avoids (sdxl_text_encoder); unset with cfg_scale > 1: what "
        "StableDiffusionXLPipeline uses without a negative prompt (zero conditioning, or the empty prompt's where the "
        "model's force_zeros_for_empty_prompt is false)",
    )
    latents: LatentsField | None = InputField(
        default=None, description="Latents to start from (sdxl_vae_encode), for image-to-image; their size must match"
    )
    denoising_strength: float = InputField(
        default=1.0, ge=0.0, le=1.0, description="With latents: how much of the schedule to run (1: all of it)"
    )
    width: int = InputField(default=1024, ge=LATENT_SCALE, le=MAX_DIMENSION, description="The width, a multiple of 8")
    height: int = InputField(default=1024, ge=LATENT_SCALE, le=MAX_DIMENSION, description="The height, a multiple of 8")
    steps: int = InputField(default=30, ge=1, le=1000, description="The number of denoising steps")
    cfg_scale: float = InputField(default=5.0, ge=1.0, le=100.0, description="Classifier-free guidance; 1 turns it off")
    scheduler: SDSchedulerName = InputField(default="euler", description="The sampler (docs/api.md, Schedulers)")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the noise")

    @field_validator("width", "height")
    @classmethod
    def _multiple_of_8(cls, value: int) -> int:
        if value % LATENT_SCALE:
            raise ValueError(f"must be a multiple of {LATENT_SCALE}, got {value}")
        return value

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        from invokeai.backend.families.sdxl import generation

        record = family_model(context, self.model, FAMILY)
        positive = generation.SdxlConditioning(
            *CONDITIONING.load(context, self.positive_conditioning.conditioning_name)
        )
        guided = self.cfg_scale > 1.0
        options = context.models.pipeline_options(record)
        negative = None
        if guided and self.negative_conditioning is not None:
            name = self.negative_conditioning.conditioning_name
            negative = generation.SdxlConditioning(*CONDITIONING.load(context, name))
        elif guided and not options["force_zeros_for_empty_prompt"]:
            # The pipeline encodes the empty prompt instead of using zeros when the model's flag says so.
            negative = _encode(context, record, "", None)
        init_latents = None
        if self.latents is not None:
            init_latents = start_latents(context, record, LATENTS, self.latents.latents_name, self.width, self.height)
        base = context.models.load(record, "scheduler")
        scheduler = SDXL.make_scheduler(self.scheduler, dict(base.config))

        with context.models.on_device(record, "unet", width=self.width, height=self.height, guidance=guided) as unet:
            latents = generation.denoise(
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
                on_step=step_reporter(context, generation.LATENT_RGB),
                requires_aesthetics_score=bool(options["requires_aesthetics_score"]),
            )
        return latents_output(context, LATENTS, latents, self.width, self.height)


class SDXLVaeDecodeInvocation(BaseInvocation):
    """The image the model's VAE decodes from latents (in fp32 for an fp16 VAE whose config says force_upcast)."""

    type: Literal["sdxl_vae_decode"] = "sdxl_vae_decode"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    latents: LatentsField = InputField(description="The latents to decode (sdxl_denoise)")

    def invoke(self, context: InvocationContext) -> ImageOutput:
        from invokeai.backend.families.sdxl import generation

        record = family_model(context, self.model, FAMILY)
        return decode_latents(context, record, LATENTS, self.latents.latents_name, generation.vae_decode)


class SDXLVaeEncodeInvocation(BaseInvocation):
    """Latents of an image, sampled from the model's VAE posterior, for image-to-image with sdxl_denoise. Give
    sdxl_denoise the same seed to get the image StableDiffusionXLImg2ImgPipeline makes with that seed."""

    type: Literal["sdxl_vae_encode"] = "sdxl_vae_encode"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    image: ImageField = InputField(description="The image; its sides must be multiples of 8")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the posterior sample")

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        from invokeai.backend.families.sdxl import generation

        record = family_model(context, self.model, FAMILY)
        return encode_image(context, record, LATENTS, self.image, self.seed, generation.vae_encode)
