"""Z-Image nodes, as InvokeAI names and shapes them: a model loader whose outputs (transformer, Qwen3 encoder, VAE)
feed the text encoder, denoise, latents-to-image and image-to-latents nodes.

Each node resolves the model its handle names, has the model manager put the component on the device with its
working memory reserved, and runs `invokeai.backend.families.zimage.generation`, which computes what diffusers'
ZImagePipeline and ZImageImg2ImgPipeline compute. InvokeAI's guidance_scale is classifier-free guidance's own
(1: none); ZImagePipeline's is one less (0: none).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from invokeai.app.nodes.base import BaseInvocationOutput, ImageField, InputField, InvocationContext, OutputField
from invokeai.app.nodes.family_nodes import FamilyNode, size_input
from invokeai.app.nodes.image import BoardField, ImageOutput, board_input, metadata_input
from invokeai.app.nodes.model_fields import (
    SEED_MAX,
    LatentsField,
    LatentsOutput,
    MetadataField,
    ModelIdentifier,
    NoMask,
    Qwen3EncoderField,
    TransformerField,
    VAEField,
)
from invokeai.app.nodes.model_use import (
    TensorKind,
    decode_latents,
    encode_image,
    family_model,
    fitted_preview,
    latents_output,
    loaded_transformer_model,
    loader_vae,
    part_handle,
    provider,
    start_latents,
    step_reporter,
)
from invokeai.backend.families.zimage.constants import TEXT_TOKENS, TURBO_CFG
from invokeai.backend.families.zimage.descriptor import FAMILY as ZIMAGE

CONDITIONING = TensorKind("conditioning", ("z_image_caption",), "z_image_text_encoder")
LATENTS = TensorKind("latents", ("z_image_latents",), "z_image_denoise or z_image_i2l")
SchedulerName = Literal[ZIMAGE.scheduler_names]  # type: ignore[valid-type]
# InvokeAI's z_image_denoise default (Z-Image-Turbo's recommended 8; diffusers' example uses 9).
INVOKEAI_STEPS = 8


def _unsupported(what: str) -> AfterValidator:
    """An input InvokeAI has for a feature this server lacks for Z-Image: null passes, any other value is refused
    naming what is missing (rather than run without what the client asked for)."""

    def check(value: Any) -> Any:
        if value is not None:
            raise ValueError(f"{what} is not supported by this server yet for Z-Image; send null")
        return value

    return AfterValidator(check)


class ZImageNode(FamilyNode):
    __node_template__ = True
    family = ZIMAGE
    latents_kind = LATENTS
    generation = "invokeai.backend.families.zimage.generation"


class ZImageConditioningField(BaseModel):
    """Caption features made by z_image_text_encoder (InvokeAI's field also carries a regional mask; this server
    has none yet)."""

    model_config = ConfigDict(extra="forbid")

    conditioning_name: str = Field(description="The name of the caption features in the tensor store")


class ZImageModelLoaderOutput(BaseInvocationOutput):
    type: Literal["z_image_model_loader_output"] = "z_image_model_loader_output"
    transformer: TransformerField = OutputField(description="The transformer (z_image_denoise)")
    qwen3_encoder: Qwen3EncoderField = OutputField(description="The Qwen3 encoder (z_image_text_encoder)")
    vae: VAEField = OutputField(description="The VAE (z_image_l2i, z_image_i2l)")


class ZImageConditioningOutput(BaseInvocationOutput):
    type: Literal["z_image_conditioning_output"] = "z_image_conditioning_output"
    conditioning: ZImageConditioningField = OutputField(description="The caption features")


class ZImageModelLoaderInvocation(ZImageNode):
    """A Z-Image model's transformer, Qwen3 encoder and VAE, for the other Z-Image nodes. A lone transformer (a
    single file or GGUF) takes its encoder and VAE from `qwen3_encoder_model` and `vae_model`, else from the
    installed Z-Image pipeline it is paired with, or from `qwen3_source_model` where that is set."""

    type: Literal["z_image_model_loader"] = "z_image_model_loader"
    model: ModelIdentifier = InputField(description="The Z-Image model or transformer file")
    vae_model: ModelIdentifier | None = InputField(
        default=None, description="A model whose 16-channel FLUX.1-style VAE to use instead of the model's"
    )
    qwen3_encoder_model: ModelIdentifier | None = InputField(
        default=None, description="A Z-Image model whose Qwen3 text encoder to use instead of the model's"
    )
    qwen3_source_model: ModelIdentifier | None = InputField(
        default=None,
        description="A Z-Image pipeline to take the VAE and Qwen3 encoder from where vae_model and "
        "qwen3_encoder_model are unset (unset: the model's own, or the pipeline it is paired with)",
    )

    def invoke(self, context: InvocationContext) -> ZImageModelLoaderOutput:
        record = loaded_transformer_model(context, self.model, ZIMAGE, "a text encoder goes in qwen3_encoder_model")
        source = family_model(context, self.qwen3_source_model, ZIMAGE.name) if self.qwen3_source_model else record
        encoder = family_model(context, self.qwen3_encoder_model, ZIMAGE.name) if self.qwen3_encoder_model else source
        encoder = provider(context, encoder, "text_encoder")
        vae = loader_vae(context, self.vae_model, source, ZIMAGE)
        return ZImageModelLoaderOutput(
            transformer=TransformerField(transformer=part_handle(record, "transformer")),
            qwen3_encoder=Qwen3EncoderField(
                tokenizer=part_handle(provider(context, encoder, "tokenizer"), "tokenizer"),
                text_encoder=part_handle(encoder, "text_encoder"),
            ),
            vae=VAEField(vae=part_handle(vae, "vae")),
        )


class ZImageTextEncoderInvocation(ZImageNode):
    """A prompt encoded by the Qwen3 text encoder: the second-to-last hidden states of the chat-templated prompt,
    padded to 512 tokens with a mask and cut back to the prompt's tokens, for z_image_denoise."""

    type: Literal["z_image_text_encoder"] = "z_image_text_encoder"
    prompt: str = InputField(description="The prompt to encode")
    qwen3_encoder: Qwen3EncoderField = InputField(description="The Qwen3 encoder (z_image_model_loader)")
    mask: NoMask = InputField(
        default=None, description="InvokeAI's regional prompt mask; this server has no regional prompts yet (null)"
    )

    def invoke(self, context: InvocationContext) -> ZImageConditioningOutput:
        generation = self.backend()
        encoder = context.models.resolve(self.qwen3_encoder.text_encoder)
        tokenizer = context.models.load(context.models.resolve(self.qwen3_encoder.tokenizer), "tokenizer")
        with context.models.on_device(encoder, "text_encoder", prompt_tokens=TEXT_TOKENS) as text_encoder:
            caption = generation.encode_prompt(text_encoder, tokenizer, self.prompt, context.models.device)
        name = CONDITIONING.save(context, caption)
        return ZImageConditioningOutput(conditioning=ZImageConditioningField(conditioning_name=name))


class ZImageDenoiseInvocation(ZImageNode):
    """Latents denoised by the Z-Image transformer with flow-matching Euler: from noise (text-to-image), or from
    `latents` (image-to-image) starting `denoising_start` of the way into the schedule. Reports every step with a
    small preview."""

    type: Literal["z_image_denoise"] = "z_image_denoise"
    transformer: TransformerField = InputField(description="The transformer (z_image_model_loader)")
    positive_conditioning: ZImageConditioningField = InputField(description="What the image shows")
    negative_conditioning: ZImageConditioningField | None = InputField(
        default=None, description="What the image avoids; needed when guidance_scale > 1"
    )
    latents: LatentsField | None = InputField(
        default=None, description="Latents to start from (z_image_i2l), for image-to-image; their size must match"
    )
    noise: Annotated[LatentsField | None, _unsupported("noise from another node")] = InputField(
        default=None, description="InvokeAI's noise input; this server draws the noise from the seed (null)"
    )
    denoise_mask: Annotated[Any, _unsupported("inpainting (a denoise mask)")] = InputField(
        default=None, description="InvokeAI's inpainting mask; this server has no Z-Image inpainting yet (null)"
    )
    denoising_start: float = InputField(
        default=0.0, ge=0.0, le=1.0, description="With latents: where in the schedule to start (0: from noise)"
    )
    denoising_end: float = InputField(
        default=1.0, ge=0.0, le=1.0, description="Where in the schedule to stop; only 1 (the end) is supported"
    )
    add_noise: bool = InputField(default=True, description="With latents: noise them to the start (only true)")
    guidance_scale: float = InputField(
        default=TURBO_CFG, ge=1.0, le=100.0, description="Classifier-free guidance; 1 turns it off (Turbo runs without)"
    )
    width: int = size_input(ZIMAGE, "width", 1024)
    height: int = size_input(ZIMAGE, "height", 1024)
    steps: int = InputField(default=INVOKEAI_STEPS, ge=1, le=1000, description="The number of denoising steps")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the noise")
    shift: float | None = InputField(
        default=None, ge=0.0, le=100.0, description="The schedule's shift; unset: the model's scheduler config"
    )
    scheduler: SchedulerName = InputField(default="euler", description="The sampler")
    control: Annotated[Any, _unsupported("Z-Image control (a control image)")] = InputField(
        default=None, description="InvokeAI's Z-Image control; this server has none yet (null)"
    )
    # InvokeAI's frontend connects the loader's VAE here on every graph (InvokeAI encodes control images with it);
    # without control or inpainting this server has no use for it.
    vae: VAEField | None = InputField(
        default=None, description="InvokeAI's VAE for control images and inpainting; accepted and not used"
    )

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        generation = self.backend()
        if self.denoising_end != 1.0:
            raise ValueError("denoising_end below 1 (stopping early for another model) is not supported; set it to 1")
        if not self.add_noise and self.latents is not None:
            raise ValueError("add_noise false is not supported; image-to-image noises the latents to the start")
        record = context.models.resolve(self.transformer.transformer)
        family_model(context, self.transformer.transformer, ZIMAGE.name)
        (positive,) = CONDITIONING.load(context, self.positive_conditioning.conditioning_name)
        guided = self.guidance_scale > 1.0
        negative = None
        if guided:
            if self.negative_conditioning is None:
                raise ValueError('guidance_scale > 1 needs negative_conditioning (encode the negative prompt, or "")')
            (negative,) = CONDITIONING.load(context, self.negative_conditioning.conditioning_name)
        init_latents = None
        if self.latents is not None:
            init_latents = start_latents(context, record, LATENTS, self.latents.latents_name, self.width, self.height)
        pipeline = provider(context, record, "scheduler")
        config = dict(context.models.load(pipeline, "scheduler").config)
        if self.shift is not None:
            config |= {"shift": self.shift, "use_dynamic_shifting": False}
        scheduler = ZIMAGE.make_scheduler(self.scheduler, config)
        on_step = step_reporter(
            context, fitted_preview(context, record, generation.known_preview_projection, generation.preview_projection)
        )
        tokens = positive.shape[0] if negative is None else max(positive.shape[0], negative.shape[0])
        with context.models.on_device(
            record, "transformer", width=self.width, height=self.height, prompt_tokens=tokens, guidance=guided
        ) as transformer:
            latents = generation.denoise(
                transformer,
                scheduler,
                prompt_embeds=positive,
                negative_embeds=negative,
                width=self.width,
                height=self.height,
                steps=self.steps,
                seed=self.seed,
                device=context.models.device,
                dtype=context.models.dtype,
                guidance_scale=self.guidance_scale,
                init_latents=init_latents,
                strength=1.0 - self.denoising_start if init_latents is not None else 1.0,
                on_step=on_step,
            )
        return latents_output(context, LATENTS, latents, self.width, self.height)


class ZImageLatentsToImageInvocation(ZImageNode):
    """The image the VAE decodes from Z-Image latents."""

    type: Literal["z_image_l2i"] = "z_image_l2i"
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    latents: LatentsField = InputField(description="The latents to decode (z_image_denoise)")
    vae: VAEField = InputField(description="The VAE (z_image_model_loader)")

    def invoke(self, context: InvocationContext) -> ImageOutput:
        vae = context.models.resolve(self.vae.vae)
        return decode_latents(
            context,
            vae,
            LATENTS,
            self.latents.latents_name,
            self.backend().vae_decode,
            metadata=self.metadata,
            board=self.board,
        )


class ZImageImageToLatentsInvocation(ZImageNode):
    """Latents of an image, sampled from the VAE posterior with the seed, for image-to-image with z_image_denoise.
    Give z_image_denoise the same seed to get the image ZImageImg2ImgPipeline makes with that seed."""

    type: Literal["z_image_i2l"] = "z_image_i2l"
    # InvokeAI's node has them (it saves no image, and neither does this one).
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    image: ImageField = InputField(description="The image; its sides must be multiples of 16")
    vae: VAEField = InputField(description="The VAE (z_image_model_loader)")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the posterior sample")

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        vae = context.models.resolve(self.vae.vae)
        return encode_image(context, vae, LATENTS, self.image, self.seed, self.backend().vae_encode)
