"""Qwen-Image nodes, as InvokeAI 6.14.2 names and shapes them: qwen_image_model_loader, whose outputs (transformer,
Qwen2.5-VL encoder, VAE) feed qwen_image_text_encoder, qwen_image_denoise, qwen_image_l2i and qwen_image_i2l.

Each node resolves the model its handle names, has the model manager put the component on the device with its
working memory reserved, and runs `invokeai.backend.families.qwen_image.generation`, which computes what diffusers'
QwenImagePipeline and QwenImageImg2ImgPipeline compute. InvokeAI's cfg_scale is the pipeline's true_cfg_scale: above
1 with a negative conditioning it guides, otherwise not. qwen_image_l2i also decodes the latents of every other
family whose graphs decode with it (InvokeAI's Krea-2 graphs do: its VAE is Qwen-Image's), with that family's VAE.
Inputs InvokeAI has for features this server lacks (Qwen-Image-Edit's reference images and latents, inpainting,
encoder quantization, tiled coding, LoRAs) are accepted when null, empty or at their defaults, and refused, naming
the input, otherwise.

Qwen-Image-Edit (a QwenImageEditPipeline or QwenImageEditPlusPipeline folder) runs through the same nodes as
InvokeAI wires them: qwen_image_text_encoder takes the reference images (its `reference_images`; the vision tower
sees them), qwen_image_i2l encodes each one as a reference (`reference` true: resized and encoded as the Edit
pipelines do) and qwen_image_denoise takes those latents (`reference_latents`), for the pipelines' image.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from invokeai.app.nodes.base import BaseInvocationOutput, ImageField, InputField, InvocationContext, OutputField
from invokeai.app.nodes.family_nodes import FamilyNode, latents_kinds_decoded_by, size_input
from invokeai.app.nodes.image import BoardField, ImageOutput, board_input, metadata_input
from invokeai.app.nodes.model_fields import (
    SEED_MAX,
    LatentsField,
    LatentsOutput,
    MetadataField,
    ModelIdentifier,
    TransformerField,
    VAEField,
)
from invokeai.app.nodes.model_use import (
    TensorKind,
    decode_latents,
    family_model,
    fitted_preview,
    latents_output,
    loaded_transformer_model,
    part_handle,
    provider,
    start_latents,
    step_reporter,
)
from invokeai.app.nodes.unsupported_inputs import only, unsupported
from invokeai.app.services.model_records import ModelRecord
from invokeai.backend.families import FAMILIES
from invokeai.backend.families.qwen_image.constants import (
    EDIT_PIPELINE,
    EDIT_PLUS_PIPELINE,
    NAME,
    TRUE_CFG_SCALE,
)
from invokeai.backend.families.qwen_image.descriptor import FAMILY as QWEN_IMAGE

CONDITIONING = TensorKind("conditioning", ("qwen_image_prompt_embeds",), "qwen_image_text_encoder")
LATENTS = TensorKind("latents", ("qwen_image_latents",), "qwen_image_denoise or qwen_image_i2l")
MAX_STEPS = 1000  # bounded work per request; InvokeAI sets no bound
INVOKEAI_STEPS = 40  # InvokeAI's qwen_image_denoise default (QwenImagePipeline's is 50: the records' defaults)
TILED_NOTE = "InvokeAI's tiled coding; this server codes whole (false)"


class QwenImageNode(FamilyNode):
    __node_template__ = True
    family = QWEN_IMAGE
    latents_kind = LATENTS
    generation = "invokeai.backend.families.qwen_image.generation"


class QwenVLEncoderField(BaseModel):
    """InvokeAI's handle on a Qwen2.5-VL encoder and its tokenizer."""

    model_config = ConfigDict(extra="forbid")

    tokenizer: ModelIdentifier = Field(description="The model whose tokenizer this is")
    text_encoder: ModelIdentifier = Field(description="The model whose Qwen2.5-VL text encoder this is")


class QwenImageConditioningField(BaseModel):
    """A prompt encoded by qwen_image_text_encoder, held in the tensor store."""

    model_config = ConfigDict(extra="forbid")

    conditioning_name: str = Field(description="The name of the conditioning tensor in the tensor store")


class QwenImageModelLoaderOutput(BaseInvocationOutput):
    type: Literal["qwen_image_model_loader_output"] = "qwen_image_model_loader_output"
    transformer: TransformerField = OutputField(description="The transformer (qwen_image_denoise)")
    qwen_vl_encoder: QwenVLEncoderField = OutputField(
        description="The Qwen2.5-VL encoder and its tokenizer (qwen_image_text_encoder)"
    )
    vae: VAEField = OutputField(description="The VAE (qwen_image_l2i, qwen_image_i2l)")


class QwenImageConditioningOutput(BaseInvocationOutput):
    type: Literal["qwen_image_conditioning_output"] = "qwen_image_conditioning_output"
    conditioning: QwenImageConditioningField = OutputField(description="The conditioning")


def _vae_families() -> list[str]:
    """The families whose VAE is Qwen-Image's: those whose graphs decode with qwen_image_l2i (Krea-2's do)."""
    return [family.name for family in FAMILIES if family.graph.decode == QWEN_IMAGE.graph.decode]


def _vae_of(context: InvocationContext, record: ModelRecord, field: str) -> ModelRecord:
    """The record providing `record`'s VAE, refused unless it is a Qwen-Image VAE (of a family in _vae_families)."""
    families = _vae_families()
    if record.family not in families:
        raise ValueError(
            f"{field}: model {record.name!r} is of the {record.family} family; {context.node_type} takes the VAE of "
            f"a {' or '.join(families)} model"
        )
    return provider(context, record, "vae")


class QwenImageModelLoaderInvocation(QwenImageNode):
    """A Qwen-Image model's transformer, Qwen2.5-VL encoder and VAE, for the other Qwen-Image nodes. The encoder and
    VAE come from `qwen_vl_encoder_model` and `vae_model` when given, else from `component_source` where that is
    set, else from the model itself or, for a lone transformer, from the installed Qwen-Image pipeline it is
    paired with."""

    type: Literal["qwen_image_model_loader"] = "qwen_image_model_loader"
    model: ModelIdentifier = InputField(description="The Qwen-Image model or transformer file")
    vae_model: ModelIdentifier | None = InputField(
        default=None, description="A model whose Qwen-Image VAE to use instead of the model's"
    )
    qwen_vl_encoder_model: ModelIdentifier | None = InputField(
        default=None, description="A Qwen-Image model whose Qwen2.5-VL text encoder to use instead of the model's"
    )
    component_source: ModelIdentifier | None = InputField(
        default=None,
        description="A Qwen-Image pipeline to take the VAE and Qwen2.5-VL encoder from where vae_model and "
        "qwen_vl_encoder_model are unset (unset: the model's own, or the pipeline it is paired with)",
    )

    def invoke(self, context: InvocationContext) -> QwenImageModelLoaderOutput:
        record = loaded_transformer_model(
            context, self.model, QWEN_IMAGE, "a text encoder goes in qwen_vl_encoder_model, a VAE in vae_model"
        )
        source = family_model(context, self.component_source, NAME) if self.component_source else record
        encoder = family_model(context, self.qwen_vl_encoder_model, NAME) if self.qwen_vl_encoder_model else source
        encoder = provider(context, encoder, "text_encoder")
        vae = _vae_of(context, context.models.resolve(self.vae_model) if self.vae_model else source, "vae_model")
        return QwenImageModelLoaderOutput(
            transformer=TransformerField(transformer=part_handle(record, "transformer")),
            qwen_vl_encoder=QwenVLEncoderField(
                tokenizer=part_handle(provider(context, encoder, "tokenizer"), "tokenizer"),
                text_encoder=part_handle(encoder, "text_encoder"),
            ),
            vae=VAEField(vae=part_handle(vae, "vae")),
        )


class QwenImageTextEncoderInvocation(QwenImageNode):
    """A prompt encoded by the Qwen2.5-VL text model: the last hidden state of the templated prompt, without the
    template's system prefix, for qwen_image_denoise's positive or negative conditioning (the pipeline's negative
    default is " ")."""

    type: Literal["qwen_image_text_encoder"] = "qwen_image_text_encoder"
    prompt: str = InputField(description="The prompt")
    reference_images: list[ImageField] = InputField(
        default=[],
        description=f"Qwen-Image-Edit's reference images: one for a {EDIT_PIPELINE} model, one or more for a "
        f"{EDIT_PLUS_PIPELINE} model, none for the others. The encoder's vision tower sees them; qwen_image_denoise "
        "takes their latents (qwen_image_i2l with reference true) as reference_latents",
    )
    qwen_vl_encoder: QwenVLEncoderField = InputField(description="The Qwen2.5-VL encoder (qwen_image_model_loader)")
    quantization: Annotated[Literal["none", "int8", "nf4"], only("none", "quantizing the encoder (quantization)")] = (
        InputField(default="none", description="InvokeAI's encoder quantization; this server runs it as stored")
    )

    def invoke(self, context: InvocationContext) -> QwenImageConditioningOutput:
        generation = self.backend()
        encoder = family_model(context, self.qwen_vl_encoder.text_encoder, NAME)
        pipeline = context.models.pipeline_options(encoder)["_class_name"]
        if self.reference_images or pipeline in (EDIT_PIPELINE, EDIT_PLUS_PIPELINE):
            embeds = self._encode_with_images(context, encoder, pipeline)
            name = CONDITIONING.save(context, embeds)
            return QwenImageConditioningOutput(conditioning=QwenImageConditioningField(conditioning_name=name))
        tokenizer = context.models.load(context.models.resolve(self.qwen_vl_encoder.tokenizer), "tokenizer")
        ids, _ = generation.tokenize(tokenizer, [self.prompt], "cpu")
        # One prompt is never padded: the text model runs causal without a mask, which is what is priced.
        with context.models.on_device(
            encoder, "text_encoder", prompt_tokens=ids.shape[1], text_padded=False
        ) as text_encoder:
            embeds, _ = generation.encode_prompt(text_encoder, tokenizer, self.prompt, context.models.device)
        name = CONDITIONING.save(context, embeds)
        return QwenImageConditioningOutput(conditioning=QwenImageConditioningField(conditioning_name=name))

    def _encode_with_images(self, context: InvocationContext, encoder: ModelRecord, pipeline: str) -> Any:
        """The prompt with the reference images, as the model's Edit pipeline encodes it (the processor from the
        model's processor/ files)."""
        from invokeai.backend.families.qwen_image import edit
        from invokeai.backend.families.qwen_image.vision_processor import load_processor

        try:
            edit.check_references(pipeline, len(self.reference_images))
        except ValueError as error:
            raise ValueError(f"reference_images: model {encoder.name!r} ({pipeline}): {error}") from None
        images = [context.load_image(field).convert("RGB") for field in self.reference_images]
        processor = context.models.load_files(encoder, "processor", load_processor)
        tokens = edit.prompt_tokens(processor, pipeline, self.prompt, images)
        patches = tuple(edit.vision_patches(processor, pipeline, images))
        with context.models.on_device(
            encoder, "text_encoder", prompt_tokens=tokens, text_padded=False, vision_patches=patches
        ) as text_encoder:
            embeds, _ = edit.encode_prompt(
                text_encoder, processor, pipeline, self.prompt, images, context.models.device
            )
        return embeds


class QwenImageDenoiseInvocation(QwenImageNode):
    """Latents denoised by the Qwen-Image transformer with flow-matching Euler on the model's schedule: from noise
    (text-to-image), or from `latents` (image-to-image) starting `denoising_start` of the way into the schedule.
    A cfg_scale above 1 with a negative conditioning runs true classifier-free guidance (one scale, or one per
    step). Reports every step with a small preview. `metadata` and `board` are InvokeAI's inputs on this node; it
    makes latents, so they are unused."""

    type: Literal["qwen_image_denoise"] = "qwen_image_denoise"
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    latents: LatentsField | None = InputField(
        default=None, description="Latents to start from (qwen_image_i2l), for image-to-image; their size must match"
    )
    reference_latents: LatentsField | list[LatentsField] | None = InputField(
        default=None,
        description="Qwen-Image-Edit's reference latents (qwen_image_i2l with reference true), one per reference "
        "image given to qwen_image_text_encoder, in the same order; any size",
    )
    denoise_mask: Annotated[dict[str, Any] | None, unsupported("inpainting (a denoise mask)")] = InputField(
        default=None, description="InvokeAI's inpainting mask; this server has no Qwen-Image inpainting yet (null)"
    )
    denoising_start: float = InputField(
        default=0.0, ge=0.0, le=1.0, description="With latents: where in the schedule to start (0: from noise)"
    )
    denoising_end: Annotated[float, only(1.0, "stopping the schedule early (denoising_end)")] = InputField(
        default=1.0, ge=0.0, le=1.0, description="Where in the schedule to stop; only 1 (the end) is supported"
    )
    transformer: TransformerField = InputField(description="The transformer (qwen_image_model_loader)")
    positive_conditioning: QwenImageConditioningField = InputField(description="What the image shows")
    negative_conditioning: QwenImageConditioningField | None = InputField(
        default=None, description='What the image avoids (the pipeline encodes " " when there is nothing to avoid)'
    )
    cfg_scale: float | Annotated[list[float], Field(max_length=MAX_STEPS)] = InputField(
        default=TRUE_CFG_SCALE,
        description="True classifier-free guidance (1 or less, or no negative conditioning: none), or one per step",
    )
    width: int = size_input(QWEN_IMAGE, "width", 1024)
    height: int = size_input(QWEN_IMAGE, "height", 1024)
    steps: int = InputField(default=INVOKEAI_STEPS, ge=1, le=MAX_STEPS, description="The number of denoising steps")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the noise")
    shift: float | None = InputField(
        default=None,
        ge=0.0,
        le=100.0,
        description="A fixed schedule shift instead of the model's resolution-dependent one (unset: the model's)",
    )

    def _scales(self, steps_run: int) -> list[float]:
        scales = self.cfg_scale if isinstance(self.cfg_scale, list) else [self.cfg_scale] * steps_run
        if len(scales) != steps_run:
            raise ValueError(
                f"cfg_scale: {len(scales)} values given for {steps_run} steps run; give one per step or a single one"
            )
        return scales

    def _references(self, context: InvocationContext) -> list[Any]:
        fields = self.reference_latents
        fields = [] if fields is None else [fields] if isinstance(fields, LatentsField) else fields
        return [LATENTS.load(context, field.latents_name)[0] for field in fields]

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        generation = self.backend()
        record = family_model(context, self.transformer.transformer, NAME)
        (positive,) = CONDITIONING.load(context, self.positive_conditioning.conditioning_name)
        negative = None
        if self.negative_conditioning is not None:
            (negative,) = CONDITIONING.load(context, self.negative_conditioning.conditioning_name)
        init_latents = None
        strength = 1.0
        if self.latents is not None:
            init_latents = start_latents(context, record, LATENTS, self.latents.latents_name, self.width, self.height)
            strength = 1.0 - self.denoising_start
        references = self._references(context)
        steps_run = generation.steps_run(self.steps, strength)
        scales = self._scales(steps_run)
        guided = negative is not None and any(scale > 1 for scale in scales)
        pipeline = provider(context, record, "scheduler")
        config = dict(context.models.load(pipeline, "scheduler").config)
        if self.shift:  # InvokeAI's node editor fills an untouched optional float with 0: the model's shift
            config |= {"shift": self.shift, "use_dynamic_shifting": False}
        scheduler = QWEN_IMAGE.make_scheduler("euler", config)
        on_step = step_reporter(
            context, fitted_preview(context, record, generation.known_preview_projection, generation.preview_projection)
        )
        scale = QWEN_IMAGE.constants.latent_scale
        tokens = positive.shape[1] if negative is None or not guided else max(positive.shape[1], negative.shape[1])
        with context.models.on_device(
            record,
            "transformer",
            width=self.width,
            height=self.height,
            prompt_tokens=tokens,
            guidance=guided,
            text_padded=False,
            reference_sizes=tuple((r.shape[-1] * scale, r.shape[-2] * scale) for r in references),
        ) as transformer:
            latents = generation.denoise(
                transformer,
                scheduler,
                prompt_embeds=positive,
                negative_embeds=negative if guided else None,
                width=self.width,
                height=self.height,
                steps=self.steps,
                seed=self.seed,
                device=context.models.device,
                dtype=context.models.dtype,
                true_cfg_scale=scales,
                init_latents=init_latents,
                strength=strength,
                reference_latents=references,
                on_step=on_step,
            )
        return latents_output(context, LATENTS, latents, self.width, self.height)


class QwenImageLatentsToImageInvocation(QwenImageNode):
    """The image the Qwen-Image VAE decodes from latents: qwen_image_denoise's, or those of another family whose
    graphs decode with this node (Krea-2's)."""

    type: Literal["qwen_image_l2i"] = "qwen_image_l2i"
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    latents: LatentsField = InputField(description="The latents to decode (qwen_image_denoise, krea2_denoise)")
    vae: VAEField = InputField(description="The VAE (qwen_image_model_loader, krea2_model_loader)")
    tiled: Annotated[bool, only(False, "tiled decoding (tiled)")] = InputField(default=False, description=TILED_NOTE)
    tile_size: int = InputField(
        default=0, ge=0, le=8192, multiple_of=8, description="InvokeAI's tile size; unused while tiled is false"
    )

    def invoke(self, context: InvocationContext) -> ImageOutput:
        vae = _vae_of(context, context.models.resolve(self.vae.vae), "vae")
        kinds = latents_kinds_decoded_by(self.type)
        kind = next((k for k in kinds if k.holds(context, self.latents.latents_name)), LATENTS)
        return decode_latents(
            context,
            vae,
            kind,
            self.latents.latents_name,
            self.backend().vae_decode,
            metadata=self.metadata,
            board=self.board,
        )


class QwenImageImageToLatentsInvocation(QwenImageNode):
    """Latents of an image (resized to width x height where given), sampled from the VAE posterior with the seed,
    for image-to-image with qwen_image_denoise. Give qwen_image_denoise the same seed to get the image
    QwenImageImg2ImgPipeline makes with that seed."""

    type: Literal["qwen_image_i2l"] = "qwen_image_i2l"
    # InvokeAI's node has them (it saves no image, and neither does this one).
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    image: ImageField = InputField(description="The image; its sides (or width and height) must be multiples of 16")
    vae: VAEField = InputField(description="The VAE (qwen_image_model_loader)")
    tiled: Annotated[bool, only(False, "tiled encoding (tiled)")] = InputField(default=False, description=TILED_NOTE)
    tile_size: int = InputField(
        default=0, ge=0, le=8192, multiple_of=8, description="InvokeAI's tile size; unused while tiled is false"
    )
    width: int | None = InputField(
        default=None, ge=16, le=8192, multiple_of=16, description="Resize the image to this width first (unset: as is)"
    )
    height: int | None = InputField(
        default=None, ge=16, le=8192, multiple_of=16, description="Resize the image to this height first (unset: as is)"
    )
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the posterior sample")
    reference: bool = InputField(
        default=False,
        description="Encode a Qwen-Image-Edit reference image for qwen_image_denoise's reference_latents, as the "
        "Edit pipelines do: resized to about 1024x1024 pixels at its aspect ratio (sides multiples of 32) unless "
        "width and height are set, the posterior's mode (no seed)",
    )

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        generation = self.backend()
        vae = provider(context, family_model(context, self.vae.vae, NAME), "vae")
        image = context.load_image(self.image).convert("RGB")
        if self.reference:
            return self._reference(context, vae, image)
        width, height = self.width or image.width, self.height or image.height
        multiple = QWEN_IMAGE.constants.size_multiple
        if width % multiple or height % multiple:
            raise ValueError(
                f"image {self.image.image_name} is {image.width}x{image.height}; qwen_image_i2l needs sides that are "
                f"multiples of {multiple} (set width and height to resize it)"
            )
        with context.models.on_device(vae, "vae_encode", width=width, height=height) as module:
            latents = generation.vae_encode(module, image, self.seed, width=self.width, height=self.height)
        return latents_output(context, LATENTS, latents, width, height)

    def _reference(self, context: InvocationContext, vae: ModelRecord, image: Any) -> LatentsOutput:
        from invokeai.backend.families.qwen_image import edit

        width, height = edit.reference_size(image.width, image.height)
        width, height = self.width or width, self.height or height
        with context.models.on_device(vae, "vae_encode", width=width, height=height) as module:
            latents = edit.encode_reference(module, image, width=width, height=height)
        return latents_output(context, LATENTS, latents, width, height)
