"""Krea-2 nodes, as InvokeAI 6.14.2 names and shapes them: krea2_model_loader, whose outputs (transformer, Qwen3-VL
encoder, VAE) feed krea2_text_encoder, krea2_denoise and qwen_image_l2i (InvokeAI decodes Krea-2 latents with its
Qwen-Image node, Krea-2's VAE being Qwen-Image's: the Qwen-Image family's node module has it, and it takes the
latents kept as this module's LATENTS, since Krea-2's graph names it as its decoder).

Each node resolves the model its handle names, has the model manager put the component on the device with its
working memory reserved, and runs `invokeai.backend.families.krea2.generation`, which computes what diffusers'
Krea2Pipeline computes. A lone transformer (a GGUF file) gets its text encoder and VAE from the loader's
`qwen3_vl_encoder_model` and `vae_model`, else from the installed Krea-2 pipeline the model manager pairs it with.
InvokeAI's cfg_scale is classifier-free guidance's own (1 or less: none); Krea2Pipeline's guidance_scale is one less
(0: none). Inputs InvokeAI has for features this server lacks (image-to-image, inpainting, style reference,
regional prompts, LoRAs, tiled decoding) are accepted when null, empty or at their defaults, and refused, naming the
input, otherwise.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from invokeai.app.nodes.base import BaseInvocationOutput, InputField, InvocationContext, OutputField
from invokeai.app.nodes.conditioning_lists import AT_MOST_ONE, ONE, single
from invokeai.app.nodes.family_nodes import FamilyNode, size_input
from invokeai.app.nodes.image import BoardField, board_input, metadata_input
from invokeai.app.nodes.model_fields import (
    SEED_MAX,
    LatentsField,
    LatentsOutput,
    MetadataField,
    ModelIdentifier,
    NoLoras,
    TensorField,
    TransformerField,
    VAEField,
)
from invokeai.app.nodes.model_use import (
    TensorKind,
    family_model,
    fitted_preview,
    latents_output,
    loaded_transformer_model,
    loader_part,
    part_handle,
    provider,
    step_reporter,
)
from invokeai.app.nodes.unsupported_inputs import only, unsupported
from invokeai.app.services.model_records import ModelRecord
from invokeai.backend.families.krea2.constants import CONSTANTS, NAME, PROMPT_TOKENS
from invokeai.backend.families.krea2.descriptor import FAMILY as KREA2

FAMILY = NAME
SIZE_MULTIPLE = CONSTANTS.size_multiple  # the VAE's 8 times the transformer's 2x2 patches
MAX_SEQUENCE_LENGTH = PROMPT_TOKENS  # Krea2Pipeline's default: prompts are padded to this many tokens
MAX_STEPS = 1000  # bounded work per request; InvokeAI sets no bound

CONDITIONING = TensorKind("conditioning", ("krea2_embeds", "krea2_mask"), "krea2_text_encoder")
LATENTS = TensorKind("latents", ("krea2_latents",), "krea2_denoise")


# InvokeAI's handles for the features this server lacks, taken as free-form objects: only null is accepted, so
# their inner shape never matters here.
_Handle = dict[str, Any]


class Krea2Node(FamilyNode):
    __node_template__ = True
    family = KREA2
    latents_kind = LATENTS
    generation = "invokeai.backend.families.krea2.generation"


class Qwen3VLEncoderField(BaseModel):
    """InvokeAI's handle on Krea-2's Qwen3-VL text encoder and its tokenizer."""

    model_config = ConfigDict(extra="forbid")

    tokenizer: ModelIdentifier = Field(description="The model whose tokenizer this is")
    text_encoder: ModelIdentifier = Field(description="The model whose Qwen3-VL text encoder this is")
    loras: NoLoras = Field(default_factory=list, description="InvokeAI's LoRAs; this server takes none yet (empty)")


class Krea2ConditioningField(BaseModel):
    """A prompt encoded by krea2_text_encoder (the tapped layers' hidden states and the padding mask), with
    InvokeAI's regional mask (this server takes none yet)."""

    model_config = ConfigDict(extra="forbid")

    conditioning_name: str = Field(description="The name of the conditioning tensors in the tensor store")
    mask: Annotated[TensorField | None, unsupported("a regional prompt mask")] = Field(
        default=None, description="InvokeAI's regional prompt mask; this server takes none yet (null)"
    )


class Krea2ModelLoaderOutput(BaseInvocationOutput):
    type: Literal["krea2_model_loader_output"] = "krea2_model_loader_output"
    transformer: TransformerField = OutputField(description="The transformer (krea2_denoise)")
    qwen3_vl_encoder: Qwen3VLEncoderField = OutputField(
        description="The Qwen3-VL encoder and its tokenizer (krea2_text_encoder)"
    )
    vae: VAEField = OutputField(description="The Qwen-Image VAE (qwen_image_l2i)")


class Krea2ConditioningOutput(BaseInvocationOutput):
    type: Literal["krea2_conditioning_output"] = "krea2_conditioning_output"
    conditioning: Krea2ConditioningField = OutputField(description="The conditioning")


def _component(context: InvocationContext, ident: ModelIdentifier, component: str) -> ModelRecord:
    """The record providing `component` for a handle (the model itself, or a lone transformer's pair); a model of
    another family is refused, naming both."""
    return provider(context, family_model(context, ident, FAMILY), component)


def _pipeline_settings(context: InvocationContext, record: ModelRecord) -> Any:
    """The pipeline options in the model's model_index.json (the defaults where it has none)."""
    from invokeai.backend.families.krea2.generation import Krea2Settings

    return Krea2Settings.from_model_index(context.models.pipeline_options(record))


class Krea2ModelLoaderInvocation(Krea2Node):
    """A Krea-2 model's transformer, Qwen3-VL encoder and Qwen-Image VAE, for the other Krea-2 nodes. The encoder
    and VAE come from `qwen3_vl_encoder_model` and `vae_model` when given, else from the model itself or, for a
    lone transformer (a GGUF file), from the installed Krea-2 pipeline it is paired with."""

    type: Literal["krea2_model_loader"] = "krea2_model_loader"
    model: ModelIdentifier = InputField(description="The Krea-2 model or transformer file")
    vae_model: ModelIdentifier | None = InputField(
        default=None, description="A Krea-2 model whose Qwen-Image VAE to use instead of the model's"
    )
    qwen3_vl_encoder_model: ModelIdentifier | None = InputField(
        default=None, description="A Krea-2 model whose Qwen3-VL text encoder to use instead of the model's"
    )

    def invoke(self, context: InvocationContext) -> Krea2ModelLoaderOutput:
        record = loaded_transformer_model(context, self.model, KREA2, "")
        encoder = self.qwen3_vl_encoder_model or self.model
        encoder_record = loader_part(
            context, encoder, "qwen3_vl_encoder_model", "text_encoder", "the Qwen3-VL encoder", KREA2
        )
        vae_record = loader_part(context, self.vae_model or self.model, "vae_model", "vae", "the Qwen-Image VAE", KREA2)
        return Krea2ModelLoaderOutput(
            transformer=TransformerField(transformer=part_handle(record, "transformer")),
            qwen3_vl_encoder=Qwen3VLEncoderField(
                tokenizer=part_handle(provider(context, encoder_record, "tokenizer"), "tokenizer"),
                text_encoder=part_handle(encoder_record, "text_encoder"),
            ),
            vae=VAEField(vae=part_handle(vae_record, "vae")),
        )


class Krea2TextEncoderInvocation(Krea2Node):
    """A prompt encoded by the Qwen3-VL text model: the hidden states of the layers the pipeline taps, padded to
    512 tokens with a mask, for krea2_denoise's positive or negative conditioning."""

    type: Literal["krea2_text_encoder"] = "krea2_text_encoder"
    prompt: str = InputField(description="The prompt")
    mask: Annotated[TensorField | None, unsupported("a regional prompt mask")] = InputField(
        default=None, description="InvokeAI's regional prompt mask; this server takes none yet (null)"
    )
    qwen3_vl_encoder: Qwen3VLEncoderField = InputField(description="The Qwen3-VL encoder (krea2_model_loader)")

    def invoke(self, context: InvocationContext) -> Krea2ConditioningOutput:
        generation = self.backend()
        source = _component(context, self.qwen3_vl_encoder.text_encoder, "text_encoder")
        tokenizer = context.models.load(_component(context, self.qwen3_vl_encoder.tokenizer, "tokenizer"), "tokenizer")
        # encode_prompt always passes the padding mask, which is what `text_padded` prices.
        with context.models.on_device(
            source, "text_encoder", prompt_tokens=MAX_SEQUENCE_LENGTH, text_padded=True
        ) as text_encoder:
            embeds, mask = generation.encode_prompt(
                text_encoder,
                tokenizer,
                self.prompt,
                context.models.device,
                select_layers=_pipeline_settings(context, source).select_layers,
                max_sequence_length=MAX_SEQUENCE_LENGTH,
            )
        name = CONDITIONING.save(context, embeds, mask)
        return Krea2ConditioningOutput(conditioning=Krea2ConditioningField(conditioning_name=name))


Conditionings = Krea2ConditioningField | Annotated[list[Krea2ConditioningField], Field(max_length=16)]


class Krea2DenoiseInvocation(Krea2Node):
    """Latents denoised by the Krea-2 transformer with flow-matching Euler and the pipeline's shift (the distilled
    model's fixed one, else resolution-dependent; `shift` overrides it). A cfg_scale above 1 runs classifier-free
    guidance against `negative_conditioning` (one scale, or one per step). Reports every step with a small preview.
    `metadata` and `board` are InvokeAI's inputs on this node; it makes latents, so they are unused."""

    type: Literal["krea2_denoise"] = "krea2_denoise"
    metadata: MetadataField | None = metadata_input()
    board: BoardField | None = board_input()
    latents: Annotated[LatentsField | None, unsupported("Krea-2 image-to-image (latents)")] = InputField(
        default=None, description="InvokeAI's latents for image-to-image; this server has none for Krea-2 yet (null)"
    )
    denoise_mask: Annotated[_Handle | None, unsupported("inpainting (a denoise mask)")] = InputField(
        default=None, description="InvokeAI's inpainting mask; this server has no inpainting yet (null)"
    )
    denoising_start: Annotated[float, only(0.0, "Krea-2 image-to-image (denoising_start)")] = InputField(
        default=0.0, ge=0.0, le=1.0, description="Where in the schedule to start; only 0 (from noise) is supported"
    )
    denoising_end: Annotated[float, only(1.0, "stopping the schedule early (denoising_end)")] = InputField(
        default=1.0, ge=0.0, le=1.0, description="Where in the schedule to stop; only 1 (the end) is supported"
    )
    transformer: TransformerField = InputField(description="The transformer (krea2_model_loader)")
    positive_conditioning: Annotated[Conditionings, ONE] = InputField(
        description="What the image shows (krea2_text_encoder): one conditioning, or a list of one (collect)"
    )
    negative_conditioning: Annotated[Conditionings | None, AT_MOST_ONE] = InputField(
        default=None, description="What the image avoids, for a cfg_scale above 1 (krea2_text_encoder)"
    )
    cfg_scale: float | Annotated[list[float], Field(max_length=MAX_STEPS)] = InputField(
        default=1.0, description="Classifier-free guidance scale (1 or less: none), or one per step"
    )
    width: int = size_input(KREA2, "width", 1024)
    height: int = size_input(KREA2, "height", 1024)
    steps: int = InputField(default=8, ge=1, le=MAX_STEPS, description="The number of denoising steps")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the noise")
    shift: float | None = InputField(
        default=None,
        ge=0.0,
        le=100.0,
        description="The schedule's shift (mu); unset or 0: the model's (fixed for the distilled model, else "
        "resolution-dependent)",
    )
    style_reference: Annotated[_Handle | None, unsupported("Krea-2 style reference")] = InputField(
        default=None, description="InvokeAI's style reference; this server takes none yet (null)"
    )
    style_reference_conditioning: Annotated[Krea2ConditioningField | None, unsupported("a style-reference prompt")] = (
        InputField(default=None, description="InvokeAI's style-reference prompt; this server takes none yet (null)")
    )

    def _pipeline_scales(self, negative: bool) -> list[float]:
        """Krea2Pipeline's guidance per step for InvokeAI's cfg_scale: one less where it is above 1 and a negative
        prompt is given, else none (0), as InvokeAI's node guides only then."""
        scales = self.cfg_scale if isinstance(self.cfg_scale, list) else [self.cfg_scale] * self.steps
        if len(scales) != self.steps:
            raise ValueError(
                f"cfg_scale: {len(scales)} values given for {self.steps} steps; give one per step or a single one"
            )
        return [scale - 1.0 if negative and scale > 1.0 else 0.0 for scale in scales]

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        generation = self.backend()
        record = family_model(context, self.transformer.transformer, FAMILY)
        positive = single(self.positive_conditioning)
        if positive is None:
            raise ValueError("positive_conditioning: no conditioning given")
        embeds, mask = CONDITIONING.load(context, positive.conditioning_name)
        negative = single(self.negative_conditioning)
        scales = self._pipeline_scales(negative is not None)
        guided = any(scale > 0 for scale in scales)
        negative_embeds = negative_mask = None
        if guided and negative is not None:
            negative_embeds, negative_mask = CONDITIONING.load(context, negative.conditioning_name)
        pipeline = provider(context, record, "scheduler")
        settings = _pipeline_settings(context, pipeline)
        scheduler = KREA2.make_scheduler("euler", dict(context.models.load(pipeline, "scheduler").config))

        on_step = step_reporter(
            context, fitted_preview(context, record, generation.known_preview_projection, generation.preview_projection)
        )
        # INVOKE_KREA2_SDPA_BACKEND (the SDPA window and per-step benchmark) is read by generation.denoise itself.
        with context.models.on_device(
            record,
            "transformer",
            width=self.width,
            height=self.height,
            prompt_tokens=embeds.shape[1],
            guidance=guided,
        ) as transformer:
            latents = generation.denoise(
                transformer,
                scheduler,
                prompt_embeds=embeds,
                prompt_mask=mask,
                negative_embeds=negative_embeds,
                negative_mask=negative_mask,
                width=self.width,
                height=self.height,
                steps=self.steps,
                guidance_scale=scales,
                seed=self.seed,
                device=context.models.device,
                dtype=context.models.dtype,
                on_step=on_step,
                is_distilled=settings.is_distilled,
                patch_size=settings.patch_size,
                mu=self.shift or None,  # InvokeAI's node editor fills an untouched optional float with 0
            )
        return latents_output(context, LATENTS, latents, self.width, self.height)
