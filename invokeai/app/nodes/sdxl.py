"""Stable Diffusion XL nodes: prompts -> conditioning, conditioning (+ latents) -> latents, latents <-> image.

Each node resolves its model, gets its component on the device with the working memory for its call reserved, and
runs `invokeai.backend.families.sdxl.generation`, which computes what diffusers' StableDiffusionXL(Img2Img)Pipeline
computes for a base model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from invokeai.app.nodes.base import InputField, InvocationContext
from invokeai.app.nodes.family_nodes import (
    FamilyNode,
    ImageToImageInputs,
    VaeDecodeNode,
    VaeEncodeNode,
    size_input,
)
from invokeai.app.nodes.model_fields import (
    ConditioningField,
    ConditioningOutput,
    LatentsOutput,
    ModelIdentifier,
    ModelInputField,
)
from invokeai.app.nodes.model_use import (
    TensorKind,
    family_model,
    latents_output,
    start_latents,
    step_reporter,
)
from invokeai.backend.families.sd_schedulers import SDSchedulerName
from invokeai.backend.families.sdxl.constants import FAMILY_NAME
from invokeai.backend.families.sdxl.descriptor import FAMILY as SDXL

if TYPE_CHECKING:
    from invokeai.app.services.model_records import ModelRecord
    from invokeai.backend.families.sdxl.generation import SdxlConditioning

FAMILY = FAMILY_NAME

CONDITIONING = TensorKind("conditioning", ("sdxl_embeds", "sdxl_pooled"), "sdxl_text_encoder")
LATENTS = TensorKind("latents", ("sdxl_latents",), "sdxl_denoise or sdxl_vae_encode")

MODEL_DESCRIPTION = "The SDXL model"


class SDXLNode(FamilyNode):
    __node_template__ = True
    family = SDXL
    latents_kind = LATENTS
    generation = "invokeai.backend.families.sdxl.generation"


class SDXLTextEncoderInvocation(SDXLNode):
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


class SDXLDenoiseInvocation(SDXLNode, ImageToImageInputs):
    """Latents denoised by the model's UNet: from noise (text-to-image), or from `latents` (image-to-image), starting
    `denoising_strength` of the way into the schedule. Reports every step with a small preview."""

    type: Literal["sdxl_denoise"] = "sdxl_denoise"
    positive_conditioning: ConditioningField = InputField(description="What the image shows (sdxl_text_encoder)")
    negative_conditioning: ConditioningField | None = InputField(
        default=None,
        description="What the image avoids (sdxl_text_encoder); unset with cfg_scale > 1: what "
        "StableDiffusionXLPipeline uses without a negative prompt (zero conditioning, or the empty prompt's where the "
        "model's force_zeros_for_empty_prompt is false)",
    )
    width: int = size_input(SDXL, "width", 1024)
    height: int = size_input(SDXL, "height", 1024)
    steps: int = InputField(default=30, ge=1, le=1000, description="The number of denoising steps")
    cfg_scale: float = InputField(default=5.0, ge=1.0, le=100.0, description="Classifier-free guidance; 1 turns it off")
    scheduler: SDSchedulerName = InputField(default="euler", description="The sampler (docs/api.md, Schedulers)")

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


class SDXLVaeDecodeInvocation(SDXLNode, VaeDecodeNode):
    """The image the model's VAE decodes from latents (in fp32 for an fp16 VAE whose config says force_upcast)."""

    type: Literal["sdxl_vae_decode"] = "sdxl_vae_decode"


class SDXLVaeEncodeInvocation(SDXLNode, VaeEncodeNode):
    """Latents of an image, sampled from the model's VAE posterior, for image-to-image with sdxl_denoise. Give
    sdxl_denoise the same seed to get the image StableDiffusionXLImg2ImgPipeline makes with that seed."""

    type: Literal["sdxl_vae_encode"] = "sdxl_vae_encode"
