"""FLUX.1 nodes, as InvokeAI 6.14.2 names and shapes them: flux_model_loader, whose outputs (transformer, CLIP,
T5 encoder, VAE and T5 length) feed flux_text_encoder, flux_denoise, flux_vae_decode and flux_vae_encode.

Each node resolves the model its handle names, has the model manager put the component on the device with its
working memory reserved, and runs `invokeai.backend.families.flux.generation`. flux_denoise computes what InvokeAI's
does (its half-precision noise, its schedule, its image-to-image start; `generation.denoise_invokeai`), which for
text-to-image is FluxPipeline's computation from that noise. Inputs InvokeAI has for features this server lacks
(ControlNets, IP-adapters, Redux, Kontext, Fill, inpainting masks, regional prompts, DyPE) are accepted when null
or empty and refused, naming the input, when set.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from invokeai.app.nodes.base import BaseInvocationOutput, ImageField, InputField, InvocationContext, OutputField
from invokeai.app.nodes.conditioning_lists import AT_MOST_ONE, ONE, single
from invokeai.app.nodes.family_nodes import FamilyNode, size_input
from invokeai.app.nodes.image import BoardField, ImageOutput, board_input, metadata_input
from invokeai.app.nodes.model_fields import (
    SEED_MAX,
    CLIPField,
    LatentsField,
    LatentsOutput,
    MetadataField,
    ModelIdentifier,
    T5EncoderField,
    TensorField,
    TransformerField,
    VAEField,
)
from invokeai.app.nodes.model_use import (
    TensorKind,
    encode_image,
    family_model,
    fitted_preview,
    latents_output,
    loaded_transformer_model,
    loader_part,
    loader_vae,
    part_handle,
    provider,
    start_latents,
    step_reporter,
)
from invokeai.app.nodes.unsupported_inputs import unsupported
from invokeai.app.services.model_records import ModelRecord
from invokeai.backend.families.flux.constants import default_t5_tokens
from invokeai.backend.families.flux.descriptor import FAMILY as FLUX

FAMILY = FLUX.name

CONDITIONING = TensorKind("conditioning", ("flux_t5_embeds", "flux_clip_pooled"), "flux_text_encoder")
LATENTS = TensorKind("latents", ("flux_latents",), "flux_denoise or flux_vae_encode")

MAX_STEPS = 1000  # bounded work per request; InvokeAI sets no bound
VAE_ENCODE_SEED = 0  # InvokeAI's flux_vae_encode samples the VAE posterior with a generator seeded 0

SchedulerName = Literal["euler", "heun", "lcm"]  # InvokeAI's FLUX schedulers (generation.SAMPLERS)
DyPEPreset = Literal["off", "manual", "auto", "area", "4k"]


def _dype_off(value: str) -> str:
    if value != "off":
        raise ValueError(f"DyPE (preset {value!r}) is not supported by this server yet; send 'off'")
    return value


# InvokeAI's handles for the features this server lacks, taken as free-form objects: only null (or an empty list)
# is accepted, so their inner shape never matters here.
_Handle = dict[str, Any]
_Handles = _Handle | list[_Handle]


class FluxNode(FamilyNode):
    __node_template__ = True
    family = FLUX
    latents_kind = LATENTS
    generation = "invokeai.backend.families.flux.generation"


class FluxConditioningField(BaseModel):
    """A prompt encoded by flux_text_encoder (T5 hidden states and CLIP's pooled output), with InvokeAI's regional
    mask (this server takes none yet)."""

    model_config = ConfigDict(extra="forbid")

    conditioning_name: str = Field(description="The name of the conditioning tensors in the tensor store")
    mask: Annotated[TensorField | None, unsupported("a regional prompt mask")] = Field(
        default=None, description="InvokeAI's regional prompt mask; this server takes none yet (null)"
    )


class FluxModelLoaderOutput(BaseInvocationOutput):
    type: Literal["flux_model_loader_output"] = "flux_model_loader_output"
    transformer: TransformerField = OutputField(description="The transformer (flux_denoise)")
    clip: CLIPField = OutputField(description="CLIP-L and its tokenizer (flux_text_encoder)")
    t5_encoder: T5EncoderField = OutputField(description="The T5 encoder and its tokenizer (flux_text_encoder)")
    vae: VAEField = OutputField(description="The VAE (flux_vae_decode, flux_vae_encode)")
    max_seq_len: Literal[256, 512] = OutputField(
        description="The T5 length the transformer is run with: 256 for schnell, 512 for dev (flux_text_encoder)"
    )


class FluxConditioningOutput(BaseInvocationOutput):
    type: Literal["flux_conditioning_output"] = "flux_conditioning_output"
    conditioning: FluxConditioningField = OutputField(description="The conditioning")


class FluxModelLoaderInvocation(FluxNode):
    """A FLUX.1 model's transformer, CLIP-L, T5 encoder and VAE, for the other FLUX nodes. The encoders and VAE
    come from `t5_encoder_model`, `clip_embed_model` and `vae_model` when given, else from the model itself or,
    for a lone transformer (a single file or GGUF), from the installed FLUX.1 pipeline it is paired with."""

    type: Literal["flux_model_loader"] = "flux_model_loader"
    model: ModelIdentifier = InputField(description="The FLUX.1 model or transformer file")
    t5_encoder_model: ModelIdentifier | None = InputField(
        default=None, description="A FLUX.1 model whose T5 encoder to use instead of the model's"
    )
    clip_embed_model: ModelIdentifier | None = InputField(
        default=None, description="A FLUX.1 model whose CLIP-L text encoder to use instead of the model's"
    )
    vae_model: ModelIdentifier | None = InputField(
        default=None, description="A model whose 16-channel FLUX.1 VAE to use instead of the model's"
    )

    def invoke(self, context: InvocationContext) -> FluxModelLoaderOutput:
        record = loaded_transformer_model(context, self.model, FLUX, "a VAE goes in vae_model")
        t5 = self.t5_encoder_model or self.model
        t5_record = loader_part(context, t5, "t5_encoder_model", "text_encoder_2", "the T5 encoder", FLUX)
        clip = self.clip_embed_model or self.model
        clip_record = loader_part(context, clip, "clip_embed_model", "text_encoder", "CLIP-L", FLUX)
        vae = loader_vae(context, self.vae_model, record, FLUX)
        # The transformer decides dev (512 T5 tokens) or schnell (256), as InvokeAI's variant does.
        tokens = default_t5_tokens(context.models.config(provider(context, record, "transformer"), "transformer"))
        return FluxModelLoaderOutput(
            transformer=TransformerField(transformer=part_handle(record, "transformer")),
            clip=CLIPField(
                tokenizer=part_handle(provider(context, clip_record, "tokenizer"), "tokenizer"),
                text_encoder=part_handle(clip_record, "text_encoder"),
                skipped_layers=0,
            ),
            t5_encoder=T5EncoderField(
                tokenizer=part_handle(provider(context, t5_record, "tokenizer_2"), "tokenizer_2"),
                text_encoder=part_handle(t5_record, "text_encoder_2"),
            ),
            vae=VAEField(vae=part_handle(vae, "vae")),
            max_seq_len=tokens,
        )


def _component(context: InvocationContext, ident: ModelIdentifier, component: str) -> ModelRecord:
    """The record providing `component` for a handle (the model itself, or a lone transformer's pair)."""
    return provider(context, context.models.resolve(ident), component)


class FluxTextEncoderInvocation(FluxNode):
    """A prompt encoded for flux_denoise: CLIP-L's pooled output and T5's hidden states of the prompt padded to
    t5_max_seq_len tokens (what FluxPipeline computes)."""

    type: Literal["flux_text_encoder"] = "flux_text_encoder"
    clip: CLIPField = InputField(description="CLIP-L and its tokenizer (flux_model_loader)")
    t5_encoder: T5EncoderField = InputField(description="The T5 encoder and its tokenizer (flux_model_loader)")
    t5_max_seq_len: Literal[256, 512] = InputField(
        description="T5 tokens the prompt is padded or cut to: 256 for schnell, 512 for dev (flux_model_loader)"
    )
    prompt: str = InputField(description="The prompt")
    prompt_2: str | None = InputField(
        default=None, description="This server's addition: a different prompt for T5 (default: the prompt)"
    )
    mask: Annotated[TensorField | None, unsupported("a regional prompt mask")] = InputField(
        default=None, description="InvokeAI's regional prompt mask; this server takes none yet (null)"
    )

    def invoke(self, context: InvocationContext) -> FluxConditioningOutput:
        generation = self.backend()
        device = context.models.device
        clip = _component(context, self.clip.text_encoder, "text_encoder")
        tokenizer = context.models.load(_component(context, self.clip.tokenizer, "tokenizer"), "tokenizer")
        with context.models.on_device(clip, "text_encoder") as text_encoder:
            pooled = generation.encode_clip(text_encoder, tokenizer, self.prompt, device)
        t5 = _component(context, self.t5_encoder.text_encoder, "text_encoder_2")
        tokenizer_2 = context.models.load(_component(context, self.t5_encoder.tokenizer, "tokenizer_2"), "tokenizer_2")
        tokens = self.t5_max_seq_len
        with context.models.on_device(t5, "text_encoder_2", prompt_tokens=tokens) as text_encoder_2:
            embeds = generation.encode_t5(text_encoder_2, tokenizer_2, self.prompt_2 or self.prompt, device, tokens)
        name = CONDITIONING.save(context, embeds, pooled)
        return FluxConditioningOutput(conditioning=FluxConditioningField(conditioning_name=name))


Conditionings = FluxConditioningField | Annotated[list[FluxConditioningField], Field(max_length=16)]


class FluxDenoiseInvocation(FluxNode):
    """Latents denoised by the FLUX.1 transformer as InvokeAI's flux_denoise does it: from its seeded noise
    (text-to-image), or from `latents` (image-to-image) noised to 1 - denoising_start, over its schedule
    (resolution-shifted for dev) with Euler, Heun or LCM; `guidance` feeds dev's guidance embedding, and a
    cfg_scale other than 1 runs true classifier-free guidance against `negative_text_conditioning`. Reports every
    step with a small preview."""

    type: Literal["flux_denoise"] = "flux_denoise"
    latents: LatentsField | None = InputField(
        default=None, description="Latents to start from (flux_vae_encode), for image-to-image; their size must match"
    )
    noise: Annotated[LatentsField | None, unsupported("noise from another node")] = InputField(
        default=None, description="InvokeAI's noise input; this server draws InvokeAI's noise from the seed (null)"
    )
    denoise_mask: Annotated[_Handle | None, unsupported("inpainting (a denoise mask)")] = InputField(
        default=None, description="InvokeAI's inpainting mask; this server has no inpainting yet (null)"
    )
    denoising_start: float = InputField(
        default=0.0, ge=0.0, le=1.0, description="Where in the schedule to start (0: from noise; with latents)"
    )
    denoising_end: float = InputField(default=1.0, ge=0.0, le=1.0, description="Where in the schedule to stop")
    add_noise: bool = InputField(default=True, description="With latents: noise them to denoising_start first")
    transformer: TransformerField = InputField(description="The transformer (flux_model_loader)")
    control_lora: Annotated[_Handle | None, unsupported("a control LoRA")] = InputField(
        default=None, description="InvokeAI's control LoRA; this server takes none yet (null)"
    )
    positive_text_conditioning: Annotated[Conditionings, ONE] = InputField(
        description="What the image shows (flux_text_encoder): one conditioning, or a list of one (collect)"
    )
    negative_text_conditioning: Annotated[Conditionings | None, AT_MOST_ONE] = InputField(
        default=None, description="What the image avoids, for a cfg_scale other than 1 (flux_text_encoder)"
    )
    redux_conditioning: Annotated[_Handles | None, unsupported("FLUX Redux", "null or []")] = InputField(
        default=None, description="InvokeAI's FLUX Redux conditioning; this server takes none yet"
    )
    fill_conditioning: Annotated[_Handle | None, unsupported("FLUX Fill")] = InputField(
        default=None, description="InvokeAI's FLUX Fill conditioning; this server takes none yet (null)"
    )
    cfg_scale: float | Annotated[list[float], Field(max_length=MAX_STEPS)] = InputField(
        default=1.0, description="Classifier-free guidance scale (1: none), or one per step"
    )
    cfg_scale_start_step: int = InputField(
        default=0, ge=-MAX_STEPS, le=MAX_STEPS, description="The first step of cfg_scale (negative: from the end)"
    )
    cfg_scale_end_step: int = InputField(
        default=-1, ge=-MAX_STEPS, le=MAX_STEPS, description="The last step of cfg_scale (negative: from the end)"
    )
    width: int = size_input(FLUX, "width", 1024)
    height: int = size_input(FLUX, "height", 1024)
    num_steps: int = InputField(
        default=4, ge=1, le=MAX_STEPS, description="The number of denoising steps (schnell: 4, dev: 50)"
    )
    scheduler: SchedulerName = InputField(default="euler", description="The sampler")
    guidance: float = InputField(
        default=4.0,
        ge=0.0,
        le=100.0,
        description="The guidance embedding of a guidance-distilled model (dev); schnell has none and ignores it",
    )
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the noise")
    control: Annotated[_Handles | None, unsupported("ControlNet", "null or []")] = InputField(
        default=None, description="InvokeAI's ControlNets; this server takes none yet"
    )
    controlnet_vae: VAEField | None = InputField(
        default=None,
        description="The VAE InvokeAI encodes control images with (flux_model_loader); used here for step previews",
    )
    ip_adapter: Annotated[_Handles | None, unsupported("an IP-adapter", "null or []")] = InputField(
        default=None, description="InvokeAI's IP-adapters; this server takes none yet"
    )
    kontext_conditioning: Annotated[_Handles | None, unsupported("FLUX Kontext", "null or []")] = InputField(
        default=None, description="InvokeAI's FLUX Kontext reference images; this server takes none yet"
    )
    dype_preset: Annotated[DyPEPreset, AfterValidator(_dype_off)] = InputField(
        default="off", description="InvokeAI's DyPE for high resolutions; this server has none yet ('off')"
    )
    dype_scale: float | None = InputField(
        default=None, ge=0.0, le=8.0, description="DyPE's magnitude; unused while dype_preset is 'off'"
    )
    dype_exponent: float | None = InputField(
        default=None, ge=0.0, le=1000.0, description="DyPE's decay speed; unused while dype_preset is 'off'"
    )

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        generation = self.backend()
        record = family_model(context, self.transformer.transformer, FAMILY)
        positive = single(self.positive_text_conditioning)
        if positive is None:
            raise ValueError("positive_text_conditioning: no conditioning given")
        prompts = [generation.Prompt(*CONDITIONING.load(context, positive.conditioning_name))]
        negative = single(self.negative_text_conditioning)
        if negative is not None:
            prompts.append(generation.Prompt(*CONDITIONING.load(context, negative.conditioning_name)))
        init_latents = None
        if self.latents is not None:
            init_latents = start_latents(context, record, LATENTS, self.latents.latents_name, self.width, self.height)
        # Previews follow the VAE the loader wired in (as controlnet_vae), else the transformer's pipeline's.
        preview_source = context.models.resolve(self.controlnet_vae.vae) if self.controlnet_vae else record
        on_step = step_reporter(
            context,
            fitted_preview(context, preview_source, generation.known_preview_projection, generation.preview_projection),
        )
        tokens = max(prompt.embeds.shape[1] for prompt in prompts)
        with context.models.on_device(
            record, "transformer", width=self.width, height=self.height, prompt_tokens=tokens
        ) as transformer:
            latents = generation.denoise_invokeai(
                transformer,
                positive=prompts[0],
                negative=prompts[1] if len(prompts) > 1 else None,
                width=self.width,
                height=self.height,
                steps=self.num_steps,
                seed=self.seed,
                device=context.models.device,
                dtype=context.models.dtype,
                scheduler=self.scheduler,
                guidance=self.guidance,
                cfg_scale=self.cfg_scale,
                cfg_scale_start_step=self.cfg_scale_start_step,
                cfg_scale_end_step=self.cfg_scale_end_step,
                init_latents=init_latents,
                denoising_start=self.denoising_start,
                denoising_end=self.denoising_end,
                add_noise=self.add_noise,
                on_step=on_step,
            )
        return latents_output(context, LATENTS, latents, self.width, self.height)


class FluxVaeDecodeInvocation(FluxNode):
    """The image the 16-channel VAE decodes from FLUX.1 latents, saved with `metadata` (core_metadata's output) in
    its invokeai_metadata chunk."""

    type: Literal["flux_vae_decode"] = "flux_vae_decode"
    latents: LatentsField = InputField(description="The latents to decode (flux_denoise)")
    vae: VAEField = InputField(description="The VAE (flux_model_loader)")
    metadata: MetadataField | None = metadata_input()
    board: BoardField | None = board_input()

    def invoke(self, context: InvocationContext) -> ImageOutput:
        vae = _component(context, self.vae.vae, "vae")
        (latents,) = LATENTS.load(context, self.latents.latents_name)
        scale = FLUX.constants.latent_scale
        height, width = (side * scale for side in latents.shape[-2:])
        with context.models.on_device(vae, "vae_decode", width=width, height=height) as module:
            image = self.backend().vae_decode(module, latents)
        return ImageOutput.saved(context, image, metadata=self.metadata, board=self.board)


class FluxVaeEncodeInvocation(FluxNode):
    """Latents of an image for image-to-image with flux_denoise: a sample of the VAE posterior drawn with seed 0,
    as InvokeAI's flux_vae_encode draws it (on the CPU here, so every device gives the same latents)."""

    type: Literal["flux_vae_encode"] = "flux_vae_encode"
    image: ImageField = InputField(description="The image; its sides must be multiples of 16")
    vae: VAEField = InputField(description="The VAE (flux_model_loader)")

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        vae = _component(context, self.vae.vae, "vae")
        return encode_image(context, vae, LATENTS, self.image, VAE_ENCODE_SEED, self.backend().vae_encode)
