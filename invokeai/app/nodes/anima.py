"""Anima nodes, as InvokeAI 6.14.2 names and shapes them: anima_model_loader, whose outputs (transformer, Qwen3
encoder, VAE) feed anima_text_encoder, anima_denoise, anima_l2i and anima_i2l.

Each node resolves the model its handle names, has the model manager put the component on the device with its
working memory reserved, and runs `invokeai.backend.families.anima.generation`, which computes what diffusers'
AnimaModularPipeline computes. anima_text_encoder runs the Qwen3 text model and tokenizes the adapter's T5 queries;
anima_denoise runs the LLM adapter (a part of the diffusion model: ComfyUI's file holds both) on the positive and
negative prompts, then the DiT. guidance_scale is the pipeline's guider's: above 1 it guides against the negative
conditioning, which is then required (the pipeline encodes "" when given no negative prompt: so does a graph).
Inputs InvokeAI has for features this server lacks (regional masks, noise from another node, inpainting, LLLite
control, LoRAs) are accepted when null, empty or at their defaults, and refused, naming the input, otherwise.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from invokeai.app.nodes.base import BaseInvocationOutput, ImageField, InputField, InvocationContext, OutputField
from invokeai.app.nodes.conditioning_lists import AT_MOST_ONE, ONE, single
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
    part_handle,
    provider,
    start_latents,
    step_reporter,
)
from invokeai.app.nodes.unsupported_inputs import only, unsupported
from invokeai.app.services.model_records import ModelRecord
from invokeai.backend.families.anima.constants import GUIDANCE_SCALE, NAME, STEPS
from invokeai.backend.families.anima.descriptor import FAMILY as ANIMA

CONDITIONING = TensorKind(
    "conditioning", ("anima_qwen_embeds", "anima_qwen_mask", "anima_t5_ids", "anima_t5_mask"), "anima_text_encoder"
)
LATENTS = TensorKind("latents", ("anima_latents",), "anima_denoise or anima_i2l")
SchedulerName = Literal[ANIMA.scheduler_names]  # type: ignore[valid-type]
MAX_STEPS = 1000  # bounded work per request; InvokeAI sets no bound


class AnimaNode(FamilyNode):
    __node_template__ = True
    family = ANIMA
    latents_kind = LATENTS
    generation = "invokeai.backend.families.anima.generation"


class AnimaConditioningField(BaseModel):
    """A prompt encoded by anima_text_encoder (the Qwen3 states and the adapter's T5 query ids), in the tensor
    store."""

    model_config = ConfigDict(extra="forbid")

    conditioning_name: str = Field(description="The name of the conditioning tensors in the tensor store")
    mask: NoMask = Field(default=None, description="InvokeAI's regional mask; this server takes none yet (null)")


Conditionings = AnimaConditioningField | Annotated[list[AnimaConditioningField], Field(max_length=16)]


class AnimaModelLoaderOutput(BaseInvocationOutput):
    type: Literal["anima_model_loader_output"] = "anima_model_loader_output"
    transformer: TransformerField = OutputField(description="The transformer and its LLM adapter (anima_denoise)")
    qwen3_encoder: Qwen3EncoderField = OutputField(description="The Qwen3 encoder (anima_text_encoder)")
    vae: VAEField = OutputField(description="The VAE (anima_l2i, anima_i2l)")


class AnimaConditioningOutput(BaseInvocationOutput):
    type: Literal["anima_conditioning_output"] = "anima_conditioning_output"
    conditioning: AnimaConditioningField = OutputField(description="The conditioning")


def _qwen_image_vae(context: InvocationContext, record: ModelRecord, field: str) -> ModelRecord:
    """The record providing `record`'s VAE, refused unless it is a Qwen-Image VAE (AutoencoderKLQwenImage, whose
    config normalises its latent channels: `z_dim`) of Anima's 16 latent channels."""
    vae = provider(context, record, "vae")
    channels = context.models.config(vae, "vae").get("z_dim")
    if channels != ANIMA.constants.latent_channels:
        raise ValueError(
            f"{field}: model {record.name!r} has no Qwen-Image VAE (AutoencoderKLQwenImage of "
            f"{ANIMA.constants.latent_channels} latent channels), which Anima's latents need"
        )
    return vae


class AnimaModelLoaderInvocation(AnimaNode):
    """An Anima model's transformer (with its LLM adapter), Qwen3 encoder and VAE, for the other Anima nodes. The
    encoder and VAE come from `qwen3_encoder_model` and `vae_model` when given (any Qwen-Image VAE: ComfyUI's
    qwen_image_vae.safetensors), else from the model itself or, for a lone diffusion model file, from the installed
    Anima pipeline it is paired with."""

    type: Literal["anima_model_loader"] = "anima_model_loader"
    model: ModelIdentifier = InputField(description="The Anima model or diffusion model file")
    vae_model: ModelIdentifier | None = InputField(
        default=None, description="A model whose Qwen-Image VAE to use instead of the model's"
    )
    qwen3_encoder_model: ModelIdentifier | None = InputField(
        default=None,
        description="An Anima model or Qwen3 encoder file whose text encoder to use instead of the model's",
    )

    def invoke(self, context: InvocationContext) -> AnimaModelLoaderOutput:
        record = loaded_transformer_model(
            context, self.model, ANIMA, "a text encoder goes in qwen3_encoder_model, a VAE in vae_model"
        )
        encoder = family_model(context, self.qwen3_encoder_model, NAME) if self.qwen3_encoder_model else record
        encoder = provider(context, encoder, "text_encoder")
        vae = _qwen_image_vae(
            context, context.models.resolve(self.vae_model) if self.vae_model else record, "vae_model"
        )
        return AnimaModelLoaderOutput(
            transformer=TransformerField(transformer=part_handle(record, "transformer")),
            qwen3_encoder=Qwen3EncoderField(
                tokenizer=part_handle(provider(context, encoder, "tokenizer"), "tokenizer"),
                text_encoder=part_handle(encoder, "text_encoder"),
            ),
            vae=VAEField(vae=part_handle(vae, "vae")),
        )


class AnimaTextEncoderInvocation(AnimaNode):
    """A prompt encoded for anima_denoise: the Qwen3 text model's last hidden state, and the T5 token ids the LLM
    adapter's queries are made of (the pipeline's negative default is "")."""

    type: Literal["anima_text_encoder"] = "anima_text_encoder"
    prompt: str = InputField(description="The prompt")
    qwen3_encoder: Qwen3EncoderField = InputField(description="The Qwen3 encoder (anima_model_loader)")
    mask: NoMask = InputField(
        default=None, description="InvokeAI's regional prompt mask; this server has no regional prompts yet (null)"
    )

    def invoke(self, context: InvocationContext) -> AnimaConditioningOutput:
        generation = self.backend()
        encoder = family_model(context, self.qwen3_encoder.text_encoder, NAME)
        tokenizer_record = context.models.resolve(self.qwen3_encoder.tokenizer)
        tokenizer = context.models.load(tokenizer_record, "tokenizer")
        # The adapter's query tokenizer comes with the Qwen tokenizer: every Anima has the same (T5's vocabulary).
        t5_tokenizer = context.models.load(provider(context, tokenizer_record, "t5_tokenizer"), "t5_tokenizer")
        _, mask = generation.tokenize(tokenizer, self.prompt, "cpu")
        # One prompt is unpadded (causal, no mask) unless it has no tokens: then one masked-out token.
        padded = not bool(mask.all())
        with context.models.on_device(
            encoder, "text_encoder", prompt_tokens=mask.shape[1], text_padded=padded
        ) as text_encoder:
            encoded = generation.encode_prompt(
                text_encoder, tokenizer, t5_tokenizer, self.prompt, context.models.device
            )
        name = CONDITIONING.save(
            context, encoded["qwen_embeds"], encoded["qwen_mask"], encoded["t5_ids"], encoded["t5_mask"]
        )
        return AnimaConditioningOutput(conditioning=AnimaConditioningField(conditioning_name=name))


class AnimaDenoiseInvocation(AnimaNode):
    """Latents denoised by the Anima DiT with flow-matching Euler on the model's schedule: from noise
    (text-to-image), or from `latents` (image-to-image) starting `denoising_start` of the way into the schedule.
    The LLM adapter turns each conditioning into the DiT's context first. Reports every step with a small
    preview."""

    type: Literal["anima_denoise"] = "anima_denoise"
    latents: LatentsField | None = InputField(
        default=None, description="Latents to start from (anima_i2l), for image-to-image; their size must match"
    )
    noise: Annotated[LatentsField | None, unsupported("noise from another node")] = InputField(
        default=None, description="InvokeAI's noise input; this server draws the noise from the seed (null)"
    )
    denoise_mask: Annotated[dict[str, Any] | None, unsupported("inpainting (a denoise mask)")] = InputField(
        default=None, description="InvokeAI's inpainting mask; this server has no Anima inpainting yet (null)"
    )
    denoising_start: float = InputField(
        default=0.0, ge=0.0, le=1.0, description="With latents: where in the schedule to start (0: from noise)"
    )
    denoising_end: Annotated[float, only(1.0, "stopping the schedule early (denoising_end)")] = InputField(
        default=1.0, ge=0.0, le=1.0, description="Where in the schedule to stop; only 1 (the end) is supported"
    )
    add_noise: Annotated[bool, only(True, "image-to-image without noise (add_noise)")] = InputField(
        default=True, description="With latents: noise them to the start (only true)"
    )
    transformer: TransformerField = InputField(description="The transformer (anima_model_loader)")
    positive_conditioning: Annotated[Conditionings, ONE] = InputField(
        description="What the image shows (anima_text_encoder): one conditioning, or a list of one (collect)"
    )
    negative_conditioning: Annotated[Conditionings | None, AT_MOST_ONE] = InputField(
        default=None, description='What the image avoids; needed when guidance_scale > 1 (the pipeline\'s is "")'
    )
    guidance_scale: float = InputField(
        default=GUIDANCE_SCALE, ge=1.0, le=100.0, description="Classifier-free guidance; 1 turns it off"
    )
    width: int = size_input(ANIMA, "width", 1024)
    height: int = size_input(ANIMA, "height", 1024)
    steps: int = InputField(default=STEPS, ge=1, le=MAX_STEPS, description="The number of denoising steps")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the noise")
    control_lllite: Annotated[Any, unsupported("Anima LLLite control")] = InputField(
        default=None, description="InvokeAI's LLLite control; this server has none yet (null)"
    )
    scheduler: SchedulerName = InputField(
        default="euler", description="The sampler (the pipeline's: euler; lcm draws its noise from the seed too)"
    )

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        generation = self.backend()
        record = family_model(context, self.transformer.transformer, NAME)
        guided = self.guidance_scale > 1.0
        positive, negative = single(self.positive_conditioning), single(self.negative_conditioning)
        assert positive is not None  # ONE takes exactly one
        prompts = [positive]
        if guided:
            if negative is None:
                raise ValueError('guidance_scale > 1 needs negative_conditioning (encode the negative prompt, or "")')
            prompts.append(negative)
        encoded = [dict(zip(("qwen_embeds", "qwen_mask", "t5_ids", "t5_mask"), CONDITIONING.load(
            context, prompt.conditioning_name), strict=True)) for prompt in prompts]  # fmt: skip
        init_latents = None
        strength = 1.0
        if self.latents is not None:
            init_latents = start_latents(context, record, LATENTS, self.latents.latents_name, self.width, self.height)
            strength = 1.0 - self.denoising_start
        scheduler = ANIMA.make_scheduler(
            self.scheduler, dict(context.models.load(provider(context, record, "scheduler"), "scheduler").config)
        )
        tokens = max(max(e["qwen_mask"].shape[1], e["t5_ids"].shape[1]) for e in encoded)
        with context.models.on_device(
            provider(context, record, "text_conditioner"), "text_conditioner", prompt_tokens=tokens
        ) as text_conditioner:
            contexts = [
                generation.condition(text_conditioner, e, context.models.device, context.models.dtype) for e in encoded
            ]
        on_step = step_reporter(
            context, fitted_preview(context, record, generation.known_preview_projection, generation.preview_projection)
        )
        with context.models.on_device(
            record, "transformer", width=self.width, height=self.height, guidance=guided
        ) as transformer:
            latents = generation.denoise(
                transformer,
                scheduler,
                prompt_embeds=contexts[0],
                negative_embeds=contexts[1] if guided else None,
                width=self.width,
                height=self.height,
                steps=self.steps,
                seed=self.seed,
                device=context.models.device,
                dtype=context.models.dtype,
                guidance_scale=self.guidance_scale,
                init_latents=init_latents,
                strength=strength,
                on_step=on_step,
            )
        return latents_output(context, LATENTS, latents, self.width, self.height)


class AnimaLatentsToImageInvocation(AnimaNode):
    """The image the Qwen-Image VAE decodes from Anima latents."""

    type: Literal["anima_l2i"] = "anima_l2i"
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    latents: LatentsField = InputField(description="The latents to decode (anima_denoise)")
    vae: VAEField = InputField(description="The VAE (anima_model_loader)")

    def invoke(self, context: InvocationContext) -> ImageOutput:
        vae = _qwen_image_vae(context, context.models.resolve(self.vae.vae), "vae")
        return decode_latents(
            context,
            vae,
            LATENTS,
            self.latents.latents_name,
            self.backend().vae_decode,
            metadata=self.metadata,
            board=self.board,
        )


class AnimaImageToLatentsInvocation(AnimaNode):
    """Latents of an image (the VAE posterior's mode, as the pipeline encodes: no seed), for image-to-image with
    anima_denoise."""

    type: Literal["anima_i2l"] = "anima_i2l"
    # InvokeAI's node has them (it saves no image, and neither does this one).
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    image: ImageField = InputField(description="The image; its sides must be multiples of 16")
    vae: VAEField = InputField(description="The VAE (anima_model_loader)")

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        vae = _qwen_image_vae(context, context.models.resolve(self.vae.vae), "vae")
        vae_encode = self.backend().vae_encode
        return encode_image(
            context, vae, LATENTS, self.image, 0, lambda module, image, _seed: vae_encode(module, image)
        )
