"""Krea-2 nodes: prompt -> conditioning (tapped Qwen3-VL layers), conditioning -> latents, latents -> image.

Each node resolves its model, reserves working memory for its call and runs `invokeai.backend.generation.krea2`,
which computes what diffusers' Krea2Pipeline computes. A model that lacks a component (a GGUF file holds only the
transformer) gets it from the installed Krea-2 pipeline the model manager pairs it with, so one name serves every
node; a graph may also name a different model per node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from invokeai.app.nodes.base import InputField, InvocationContext
from invokeai.app.nodes.family_nodes import (
    DenoiseInputs,
    FamilyNode,
    VaeDecodeNode,
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
    fitted_preview,
    latents_output,
    provider,
    step_reporter,
)
from invokeai.backend.families.krea2.constants import CONSTANTS, NAME, PROMPT_TOKENS
from invokeai.backend.families.krea2.descriptor import FAMILY as KREA2

if TYPE_CHECKING:
    from invokeai.app.services.model_records import ModelRecord
    from invokeai.backend.families.krea2.generation import Krea2Settings


FAMILY = NAME
SIZE_MULTIPLE = CONSTANTS.size_multiple  # the VAE's 8 times the transformer's 2x2 patches
MAX_SEQUENCE_LENGTH = PROMPT_TOKENS  # Krea2Pipeline's default: prompts are padded to this many tokens

CONDITIONING = TensorKind("conditioning", ("krea2_embeds", "krea2_mask"), "krea2_text_encoder")
LATENTS = TensorKind("latents", ("krea2_latents",), "krea2_denoise")

MODEL_DESCRIPTION = "The Krea-2 model (a GGUF transformer gets this component from its paired Krea-2 pipeline)"


class Krea2Node(FamilyNode):
    __node_template__ = True
    family = KREA2
    latents_kind = LATENTS
    generation = "invokeai.backend.families.krea2.generation"


def _pipeline_settings(context: InvocationContext, record: ModelRecord) -> Krea2Settings:
    """The pipeline options in the model's model_index.json (the defaults where it has none)."""
    from invokeai.backend.families.krea2.generation import Krea2Settings

    return Krea2Settings.from_model_index(context.models.pipeline_options(record))


class Krea2TextEncoderInvocation(Krea2Node):
    """A prompt encoded by the model's Qwen3-VL text model: the hidden states of the layers the pipeline taps, for
    krea2_denoise's positive or negative conditioning."""

    type: Literal["krea2_text_encoder"] = "krea2_text_encoder"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    prompt: str = InputField(default="", description="The prompt")

    def invoke(self, context: InvocationContext) -> ConditioningOutput:
        from invokeai.backend.families.krea2 import generation as krea2

        source = provider(context, family_model(context, self.model, FAMILY), "text_encoder")
        tokenizer = context.models.load(source, "tokenizer")
        # encode_prompt always passes the padding mask, which is what `text_padded` prices.
        with context.models.on_device(
            source, "text_encoder", prompt_tokens=MAX_SEQUENCE_LENGTH, text_padded=True
        ) as text_encoder:
            embeds, mask = krea2.encode_prompt(
                text_encoder,
                tokenizer,
                self.prompt,
                context.models.device,
                select_layers=_pipeline_settings(context, source).select_layers,
                max_sequence_length=MAX_SEQUENCE_LENGTH,
            )
        return ConditioningOutput(
            conditioning=ConditioningField(conditioning_name=CONDITIONING.save(context, embeds, mask))
        )


class Krea2DenoiseInvocation(Krea2Node, DenoiseInputs):
    """Latents denoised by the model's transformer with flow-matching Euler and the pipeline's dynamic shift."""

    type: Literal["krea2_denoise"] = "krea2_denoise"
    positive_conditioning: ConditioningField = InputField(description="What the image shows (krea2_text_encoder)")
    negative_conditioning: ConditioningField | None = InputField(
        default=None, description="What the image avoids (krea2_text_encoder); needed when guidance_scale > 0"
    )
    width: int = size_input(KREA2, "width", 1024)
    height: int = size_input(KREA2, "height", 1024)
    steps: int = InputField(default=28, ge=1, le=1000, description="The number of denoising steps")
    guidance_scale: float = InputField(
        default=4.5, ge=0.0, le=100.0, description="Classifier-free guidance (Krea-2's convention); 0 turns it off"
    )

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        from invokeai.backend.families.krea2 import generation as krea2

        record = family_model(context, self.model, FAMILY)
        embeds, mask = CONDITIONING.load(context, self.positive_conditioning.conditioning_name)
        guided = self.guidance_scale > 0
        negative_embeds = negative_mask = None
        if guided:
            if self.negative_conditioning is None:
                raise ValueError('guidance_scale > 0 needs negative_conditioning (encode the negative prompt, or "")')
            negative_embeds, negative_mask = CONDITIONING.load(context, self.negative_conditioning.conditioning_name)
        pipeline = provider(context, record, "scheduler")
        settings = _pipeline_settings(context, pipeline)
        scheduler = KREA2.make_scheduler("euler", dict(context.models.load(pipeline, "scheduler").config))

        on_step = step_reporter(
            context, fitted_preview(context, record, krea2.known_preview_projection, krea2.preview_projection)
        )
        # INVOKE_KREA2_SDPA_BACKEND (the SDPA window and per-step benchmark) is read by krea2.denoise itself.
        with context.models.on_device(
            record,
            "transformer",
            width=self.width,
            height=self.height,
            prompt_tokens=embeds.shape[1],
            guidance=guided,
        ) as transformer:
            latents = krea2.denoise(
                transformer,
                scheduler,
                prompt_embeds=embeds,
                prompt_mask=mask,
                negative_embeds=negative_embeds,
                negative_mask=negative_mask,
                width=self.width,
                height=self.height,
                steps=self.steps,
                guidance_scale=self.guidance_scale,
                seed=self.seed,
                device=context.models.device,
                dtype=context.models.dtype,
                on_step=on_step,
                is_distilled=settings.is_distilled,
                patch_size=settings.patch_size,
            )
        return latents_output(context, LATENTS, latents, self.width, self.height)


class Krea2VaeDecodeInvocation(Krea2Node, VaeDecodeNode):
    """The image the model's Qwen-Image VAE decodes from latents."""

    type: Literal["krea2_vae_decode"] = "krea2_vae_decode"
