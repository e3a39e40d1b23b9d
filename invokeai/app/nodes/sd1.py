"""Stable Diffusion 1.x nodes: prompt -> conditioning, conditioning (+ latents) -> latents, latents <-> image.

Each node resolves its model, reserves working memory for its call and runs `invokeai.backend.families.sd1.generation`,
which computes what diffusers' StableDiffusion(Img2Img)Pipeline computes. The VAE nodes and the inputs every denoise
node has are the family-neutral templates of family_nodes.py.
"""

from __future__ import annotations

from typing import Literal

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
from invokeai.app.nodes.model_use import TensorKind, family_model, latents_output, start_latents, step_reporter
from invokeai.backend.families.sd1.constants import NAME
from invokeai.backend.families.sd1.descriptor import FAMILY as SD1
from invokeai.backend.families.sd_schedulers import SDSchedulerName

FAMILY = NAME

CONDITIONING = TensorKind("conditioning", ("sd1_clip_embeds",), "sd_text_encoder")
LATENTS = TensorKind("latents", ("sd1_latents",), "sd_denoise or sd_vae_encode")

MODEL_DESCRIPTION = "The SD-1 model"


class SD1Node(FamilyNode):
    __node_template__ = True
    family = SD1
    latents_kind = LATENTS
    generation = "invokeai.backend.families.sd1.generation"


class SDTextEncoderInvocation(SD1Node):
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


class SDDenoiseInvocation(SD1Node, ImageToImageInputs):
    """Latents denoised by the model's UNet: from noise (text-to-image), or from `latents` (image-to-image), starting
    `denoising_strength` of the way into the schedule. Reports every step with a small preview."""

    type: Literal["sd_denoise"] = "sd_denoise"
    positive_conditioning: ConditioningField = InputField(description="What the image shows (sd_text_encoder)")
    negative_conditioning: ConditioningField | None = InputField(
        default=None, description="What the image avoids (sd_text_encoder); needed when cfg_scale > 1"
    )
    width: int = size_input(SD1, "width", 512)
    height: int = size_input(SD1, "height", 512)
    steps: int = InputField(default=30, ge=1, le=1000, description="The number of denoising steps")
    cfg_scale: float = InputField(default=7.5, ge=1.0, le=100.0, description="Classifier-free guidance; 1 turns it off")
    scheduler: SDSchedulerName = InputField(default="euler", description="The sampler (docs/api.md, Schedulers)")

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


class SDVaeDecodeInvocation(SD1Node, VaeDecodeNode):
    """The image the model's VAE decodes from latents."""

    type: Literal["sd_vae_decode"] = "sd_vae_decode"


class SDVaeEncodeInvocation(SD1Node, VaeEncodeNode):
    """Latents of an image, sampled from the model's VAE posterior, for image-to-image with sd_denoise. Give
    sd_denoise the same seed to get the image StableDiffusionImg2ImgPipeline makes with that seed."""

    type: Literal["sd_vae_encode"] = "sd_vae_encode"
