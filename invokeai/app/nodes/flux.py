"""FLUX.1 nodes: prompt -> conditioning (T5 hidden states and CLIP's pooled vector), conditioning (+ latents) ->
latents, latents <-> image.

Each node resolves its model, has the model manager put the component on the device with its working memory
reserved, and runs `invokeai.backend.families.flux.generation`, which computes what diffusers' FluxPipeline and
FluxImg2ImgPipeline compute. A lone transformer (a BFL single file or a GGUF) gets its text encoders, VAE and
scheduler from the installed FLUX.1 pipeline the manager pairs it with, so one name serves every node.
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
    fitted_preview,
    latents_output,
    provider,
    start_latents,
    step_reporter,
)
from invokeai.backend.families.flux.constants import DEFAULT_GUIDANCE, T5_TOKENS_DEV, default_t5_tokens
from invokeai.backend.families.flux.descriptor import FAMILY as FLUX

if TYPE_CHECKING:
    pass


FAMILY = FLUX.name

CONDITIONING = TensorKind("conditioning", ("flux_t5_embeds", "flux_clip_pooled"), "flux_text_encoder")
LATENTS = TensorKind("latents", ("flux_latents",), "flux_denoise or flux_vae_encode")

MODEL_DESCRIPTION = "The FLUX.1 model (a lone transformer gets this component from its paired FLUX.1 pipeline)"


class FluxNode(FamilyNode):
    __node_template__ = True
    family = FLUX
    latents_kind = LATENTS
    generation = "invokeai.backend.families.flux.generation"


class FluxTextEncoderInvocation(FluxNode):
    """A prompt encoded for flux_denoise: CLIP-L's pooled output and T5's hidden states of the prompt padded to
    max_sequence_length tokens."""

    type: Literal["flux_text_encoder"] = "flux_text_encoder"
    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    prompt: str = InputField(default="", description="The prompt")
    prompt_2: str | None = InputField(default=None, description="A different prompt for T5 (default: the prompt)")
    max_sequence_length: int | None = InputField(
        default=None,
        ge=1,
        le=T5_TOKENS_DEV,
        description="T5 tokens the prompt is padded or cut to; default: the model's (512 for dev, 256 for schnell)",
    )

    def invoke(self, context: InvocationContext) -> ConditioningOutput:
        from invokeai.backend.families.flux import generation

        record = family_model(context, self.model, FAMILY)
        tokens = self.max_sequence_length
        if tokens is None:
            # The named model's transformer decides dev or schnell, even where its encoders come from a pair.
            tokens = default_t5_tokens(context.models.config(provider(context, record, "transformer"), "transformer"))
        device = context.models.device
        clip = provider(context, record, "text_encoder")
        tokenizer = context.models.load(clip, "tokenizer")
        with context.models.on_device(clip, "text_encoder") as text_encoder:
            pooled = generation.encode_clip(text_encoder, tokenizer, self.prompt, device)
        t5 = provider(context, record, "text_encoder_2")
        tokenizer_2 = context.models.load(t5, "tokenizer_2")
        with context.models.on_device(t5, "text_encoder_2", prompt_tokens=tokens) as text_encoder_2:
            embeds = generation.encode_t5(text_encoder_2, tokenizer_2, self.prompt_2 or self.prompt, device, tokens)
        name = CONDITIONING.save(context, embeds, pooled)
        return ConditioningOutput(conditioning=ConditioningField(conditioning_name=name))


class FluxDenoiseInvocation(FluxNode, ImageToImageInputs):
    """Latents denoised by the model's transformer with flow-matching Euler and the resolution-dependent shift:
    from noise (text-to-image), or from `latents` (image-to-image), starting `denoising_strength` of the way into
    the schedule. Reports every step with a small preview."""

    type: Literal["flux_denoise"] = "flux_denoise"
    conditioning: ConditioningField = InputField(description="What the image shows (flux_text_encoder)")
    width: int = size_input(FLUX, "width", 1024)
    height: int = size_input(FLUX, "height", 1024)
    steps: int = InputField(default=28, ge=1, le=1000, description="The number of denoising steps (schnell: 4)")
    guidance: float = InputField(
        default=DEFAULT_GUIDANCE,
        ge=0.0,
        le=100.0,
        description="The guidance embedding of a guidance-distilled model (dev); schnell has none and ignores it",
    )

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        from invokeai.backend.families.flux import generation

        record = family_model(context, self.model, FAMILY)
        embeds, pooled = CONDITIONING.load(context, self.conditioning.conditioning_name)
        init_latents = None
        if self.latents is not None:
            init_latents = start_latents(context, record, LATENTS, self.latents.latents_name, self.width, self.height)
        pipeline = provider(context, record, "scheduler")
        scheduler = FLUX.make_scheduler("euler", dict(context.models.load(pipeline, "scheduler").config))
        on_step = step_reporter(
            context, fitted_preview(context, record, generation.known_preview_projection, generation.preview_projection)
        )
        with context.models.on_device(
            record, "transformer", width=self.width, height=self.height, prompt_tokens=embeds.shape[1]
        ) as transformer:
            latents = generation.denoise(
                transformer,
                scheduler,
                prompt_embeds=embeds,
                pooled_embeds=pooled,
                width=self.width,
                height=self.height,
                steps=self.steps,
                seed=self.seed,
                device=context.models.device,
                dtype=context.models.dtype,
                guidance=self.guidance,
                init_latents=init_latents,
                strength=self.denoising_strength,
                on_step=on_step,
            )
        return latents_output(context, LATENTS, latents, self.width, self.height)


class FluxVaeDecodeInvocation(FluxNode, VaeDecodeNode):
    """The image the model's 16-channel VAE decodes from latents."""

    type: Literal["flux_vae_decode"] = "flux_vae_decode"


class FluxVaeEncodeInvocation(FluxNode, VaeEncodeNode):
    """Latents of an image, sampled from the model's VAE posterior, for image-to-image with flux_denoise. Give
    flux_denoise the same seed to get the image FluxImg2ImgPipeline makes with that seed."""

    type: Literal["flux_vae_encode"] = "flux_vae_encode"
