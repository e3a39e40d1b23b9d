"""InvokeAI's node types for Stable Diffusion 1.x and SDXL, as its frontend's linear graphs (buildSD1Graph,
buildSDXLGraph) wire them: the model loaders hand out InvokeAI's UNetField, CLIPField and VAEField, `compel` and
`sdxl_compel_prompt` encode prompts, `noise` draws the starting noise, `denoise_latents` denoises, `l2i` and `i2l`
decode and encode.

They run on the same generation code as this server's own sd_* and sdxl_* nodes (the families' generation modules
and their shared denoise loop, invokeai.backend.families.sd_denoise), and store what they make under the same tensor
kinds, so that an sd_denoise can take a compel's conditioning and an sd_vae_decode a denoise_latents' latents. What
InvokeAI offers and this server does not run yet (LoRAs, ControlNet, IP-Adapter, T2I-Adapter, regional masks, inpaint
masks, HiDiffusion, tiled VAE, boards) is refused naming the field, when it is set, rather than ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator

from invokeai.app.nodes import sd1 as sd1_nodes
from invokeai.app.nodes import sdxl as sdxl_nodes
from invokeai.app.nodes.base import BaseInvocation, BaseInvocationOutput, Input, InputField, OutputField
from invokeai.app.nodes.context import InvocationContext
from invokeai.app.nodes.fields import ImageField
from invokeai.app.nodes.image import (
    MAX_DIMENSION,
    BoardField,
    ImageOutput,
    MetadataField,
    board_input,
    metadata_input,
)
from invokeai.app.nodes.model_fields import (
    SEED_MAX,
    CLIPField,
    ConditioningField,
    ConditioningOutput,
    LatentsField,
    LatentsOutput,
    ModelIdentifier,
    NoMask,
    UNetField,
    VAEField,
)
from invokeai.app.nodes.model_use import TensorKind, provider, step_reporter
from invokeai.backend.families.sd1.constants import NAME as SD1
from invokeai.backend.families.sd_schedulers import SD_SCHEDULER_NAMES, SDSchedulerName, make_sd_scheduler
from invokeai.backend.families.sdxl.constants import FAMILY_NAME as SDXL

if TYPE_CHECKING:
    import torch

    from invokeai.app.services.model_records import ModelRecord

LATENT_SCALE = 8  # both families' VAEs: 8 pixels a latent
SD_FAMILIES = (SD1, SDXL)

# What these nodes store, under the keys this server's own SD nodes use where the tensors are the same, so each
# family's own nodes take them too. sdxl_compel_prompt's conditioning also carries its micro-conditioning.
SD1_CONDITIONING = TensorKind("conditioning", sd1_nodes.CONDITIONING.keys, "compel or sd_text_encoder")
SDXL_CONDITIONING = TensorKind("conditioning", sdxl_nodes.CONDITIONING.keys, "sdxl_text_encoder")
SDXL_COMPEL_CONDITIONING = TensorKind(
    "conditioning", (*sdxl_nodes.CONDITIONING.keys, "sdxl_time_ids"), "sdxl_compel_prompt"
)
NOISE = TensorKind("noise", ("noise",), "noise")
LATENTS = {SD1: sd1_nodes.LATENTS, SDXL: sdxl_nodes.LATENTS}
LATENT_KINDS = (
    TensorKind("latents", sd1_nodes.LATENTS.keys, "denoise_latents, i2l, sd_denoise or sd_vae_encode"),
    TensorKind("latents", sdxl_nodes.LATENTS.keys, "denoise_latents, i2l, sdxl_denoise or sdxl_vae_encode"),
    NOISE,
)

# InvokeAI 6.14.2's scheduler names that this server has no sampler for yet: er_sde is InvokeAI's own scheduler
# class, not one of diffusers'.
INVOKEAI_ONLY_SCHEDULERS = frozenset({"er_sde"})


def _known_scheduler(value: Any) -> Any:
    if isinstance(value, str) and value in INVOKEAI_ONLY_SCHEDULERS:
        raise ValueError(
            f"InvokeAI's scheduler {value!r} is not run by this server yet; it runs {', '.join(SD_SCHEDULER_NAMES)}"
        )
    return value


InvokeAISchedulerName = Annotated[SDSchedulerName, BeforeValidator(_known_scheduler)]


def _none_only(what: str) -> AfterValidator:
    """An input InvokeAI has that this server does not act on yet: accepted null (or an empty list, what an empty
    collect gives), refused otherwise naming what is missing."""

    def check(value: Any) -> Any:
        if value not in (None, []):
            raise ValueError(f"{what} are not supported by this server yet; send null")
        return value

    return AfterValidator(check)


def _off(what: str) -> AfterValidator:
    def check(value: bool) -> bool:
        if value:
            raise ValueError(f"{what} is not supported by this server yet; send false")
        return value

    return AfterValidator(check)


NoTiling = Annotated[bool, _off("tiled VAE decoding and encoding")]
TILE_SIZE_DESCRIPTION = "The tile size for VAE tiling in pixels (image space); unused while tiled is false"


# --- what the nodes share --------------------------------------------------------------------------------------


def _sd_model(
    context: InvocationContext, ident: ModelIdentifier, families: tuple[str, ...] = SD_FAMILIES
) -> ModelRecord:
    """The record `ident` names, refused before anything loads unless it is of one of `families`."""
    record = context.models.resolve(ident)
    if record.family not in families:
        raise ValueError(
            f"model {record.name!r} is of the {record.family} family; {context.node_type} needs a model of the "
            f"{' or '.join(families)} family"
        )
    return record


def _part(context: InvocationContext, ident: ModelIdentifier, allowed: tuple[str, ...], family: str) -> str:
    """The component a handle names (its submodel_type; the first of `allowed` where it names none)."""
    part = ident.submodel_type or allowed[0]
    if part not in allowed:
        raise ValueError(f"{context.node_type} takes the {' or '.join(allowed)} of a {family} model, not its {part}")
    return part


def _load_any(context: InvocationContext, name: str, kinds: tuple[TensorKind, ...], what: str) -> tuple[Any, ...]:
    """(the kind, its tensors) of a stored entry that may be of any of `kinds`."""
    stored = context.tensors.load(name)
    for kind in kinds:
        if isinstance(stored, dict) and set(stored) == set(kind.keys):
            return (kind, *(stored[key] for key in kind.keys))
    makers = " or ".join(dict.fromkeys(kind.made_by for kind in kinds))
    raise ValueError(f"{what} {name!r} was not made by {makers}, which {context.node_type} needs")


def _latents(context: InvocationContext, field: LatentsField) -> torch.Tensor:
    _, latents = _load_any(context, field.latents_name, LATENT_KINDS, "latents")
    return latents  # type: ignore[no-any-return]


# --- model loaders -------------------------------------------------------------------------------------------------


class ModelLoaderOutput(BaseInvocationOutput):
    type: Literal["model_loader_output"] = "model_loader_output"
    unet: UNetField = OutputField(description="UNet (scheduler, LoRAs)", title="UNet")
    clip: CLIPField = OutputField(description="CLIP (tokenizer, text encoder, LoRAs) and skipped layer count")
    vae: VAEField = OutputField(description="VAE", title="VAE")


class SDXLModelLoaderOutput(BaseInvocationOutput):
    type: Literal["sdxl_model_loader_output"] = "sdxl_model_loader_output"
    unet: UNetField = OutputField(description="UNet (scheduler, LoRAs)", title="UNet")
    clip: CLIPField = OutputField(description="CLIP (tokenizer, text encoder, LoRAs) and skipped layer count")
    clip2: CLIPField = OutputField(description="CLIP 2 (tokenizer, text encoder, LoRAs) and skipped layer count")
    vae: VAEField = OutputField(description="VAE", title="VAE")


class VAEOutput(BaseInvocationOutput):
    type: Literal["vae_output"] = "vae_output"
    vae: VAEField = OutputField(description="VAE", title="VAE")


def _with_part(model: ModelIdentifier, part: str) -> ModelIdentifier:
    return model.model_copy(update={"submodel_type": part})


def _unet(model: ModelIdentifier) -> UNetField:
    return UNetField(unet=_with_part(model, "unet"), scheduler=_with_part(model, "scheduler"))


def _clip(model: ModelIdentifier, tokenizer: str, text_encoder: str) -> CLIPField:
    return CLIPField(
        tokenizer=_with_part(model, tokenizer), text_encoder=_with_part(model, text_encoder), skipped_layers=0
    )


class MainModelLoaderInvocation(BaseInvocation):
    """Loads an SD-1 main model, outputting its submodels (InvokeAI's "Main Model - SD1.5, SD2")."""

    type: Literal["main_model_loader"] = "main_model_loader"
    model: ModelIdentifier = InputField(description="Main model (UNet, VAE, CLIP) to load")

    def invoke(self, context: InvocationContext) -> ModelLoaderOutput:
        _sd_model(context, self.model, (SD1,))
        return ModelLoaderOutput(
            unet=_unet(self.model),
            clip=_clip(self.model, "tokenizer", "text_encoder"),
            vae=VAEField(vae=_with_part(self.model, "vae")),
        )


class SDXLModelLoaderInvocation(BaseInvocation):
    """Loads an SDXL base model, outputting its submodels (InvokeAI's "Main Model - SDXL")."""

    type: Literal["sdxl_model_loader"] = "sdxl_model_loader"
    model: ModelIdentifier = InputField(description="SDXL Main model (UNet, VAE, CLIP1, CLIP2) to load")

    def invoke(self, context: InvocationContext) -> SDXLModelLoaderOutput:
        _sd_model(context, self.model, (SDXL,))
        return SDXLModelLoaderOutput(
            unet=_unet(self.model),
            clip=_clip(self.model, "tokenizer", "text_encoder"),
            clip2=_clip(self.model, "tokenizer_2", "text_encoder_2"),
            vae=VAEField(vae=_with_part(self.model, "vae")),
        )


class VAELoaderInvocation(BaseInvocation):
    """Loads a VAE model, outputting a VaeLoaderOutput: the VAE of the model it names (an SD-1 or SDXL model's)."""

    type: Literal["vae_loader"] = "vae_loader"
    vae_model: ModelIdentifier = InputField(description="VAE model to load", title="VAE")

    def invoke(self, context: InvocationContext) -> VAEOutput:
        context.models.resolve(self.vae_model)  # an unknown model fails here, as in InvokeAI
        return VAEOutput(vae=VAEField(vae=_with_part(self.vae_model, "vae")))


# --- prompts -------------------------------------------------------------------------------------------------------


class CLIPSkipInvocationOutput(BaseInvocationOutput):
    type: Literal["clip_skip_output"] = "clip_skip_output"
    clip: CLIPField | None = OutputField(default=None, description="CLIP with its skipped layers", title="CLIP")


class CLIPSkipInvocation(BaseInvocation):
    """Skip layers in clip text_encoder model: the encoders that take this CLIP leave out its last layers."""

    type: Literal["clip_skip"] = "clip_skip"
    clip: CLIPField = InputField(description="CLIP (tokenizer, text encoder, LoRAs)", input=Input.CONNECTION)
    skipped_layers: int = InputField(default=0, ge=0, le=100, description="Number of layers to skip in text encoder")

    def invoke(self, context: InvocationContext) -> CLIPSkipInvocationOutput:
        data = self.clip.model_dump()
        data["skipped_layers"] += self.skipped_layers
        return CLIPSkipInvocationOutput(clip=CLIPField.model_validate(data))


PROMPT_DESCRIPTION = (
    "Prompt to be parsed by Compel to create a conditioning tensor. This server reads it as plain text for now: "
    "Compel's weighting syntax ((word)1.2, .and(), .blend()) is encoded as the characters it is"
)


class CompelInvocation(BaseInvocation):
    """Encodes a prompt with an SD-1 model's CLIP text encoder: its last hidden state (with the CLIP's skipped
    layers left out), as InvokeAI's compel node gives for plain text."""

    type: Literal["compel"] = "compel"
    prompt: str = InputField(default="", description=PROMPT_DESCRIPTION)
    clip: CLIPField = InputField(description="CLIP (tokenizer, text encoder, LoRAs) and skipped layer count")
    mask: NoMask = InputField(
        default=None, description="A mask defining the region that this conditioning prompt applies to."
    )

    def invoke(self, context: InvocationContext) -> ConditioningOutput:
        from invokeai.backend.families.sd1 import generation

        record = _sd_model(context, self.clip.text_encoder, (SD1,))
        part = _part(context, self.clip.text_encoder, ("text_encoder",), SD1)
        tokenizer_record = _sd_model(context, self.clip.tokenizer, (SD1,))
        tokenizer = context.models.load(tokenizer_record, _part(context, self.clip.tokenizer, ("tokenizer",), SD1))
        with context.models.on_device(record, part) as text_encoder:
            embeds = generation.encode_prompt(
                text_encoder, tokenizer, self.prompt, context.models.device, self.clip.skipped_layers
            )
        return ConditioningOutput(
            conditioning=ConditioningField(conditioning_name=SD1_CONDITIONING.save(context, embeds))
        )


class SDXLCompelPromptInvocation(BaseInvocation):
    """Encodes a prompt with both of an SDXL model's CLIP text encoders (`style`, where given, is the second's
    prompt), with the micro-conditioning (original size, crop, target size) the UNet is given for it. An empty
    prompt is zero conditioning, as in InvokeAI."""

    type: Literal["sdxl_compel_prompt"] = "sdxl_compel_prompt"
    prompt: str = InputField(default="", description=PROMPT_DESCRIPTION)
    style: str = InputField(default="", description=PROMPT_DESCRIPTION)
    original_width: int = InputField(default=1024, description="")
    original_height: int = InputField(default=1024, description="")
    crop_top: int = InputField(default=0, description="")
    crop_left: int = InputField(default=0, description="")
    target_width: int = InputField(default=1024, description="")
    target_height: int = InputField(default=1024, description="")
    clip: CLIPField = InputField(description="CLIP 1", input=Input.CONNECTION, title="CLIP 1")
    clip2: CLIPField = InputField(description="CLIP 2", input=Input.CONNECTION, title="CLIP 2")
    mask: NoMask = InputField(
        default=None, description="A mask defining the region that this conditioning prompt applies to."
    )

    def _encode(self, context: InvocationContext, clip: CLIPField, prompt: str, part: str) -> tuple[Any, Any]:
        """(hidden states, pooled projection or None) of one encoder; zeros for an empty prompt."""
        import torch

        from invokeai.backend.families.sdxl import generation

        record = _sd_model(context, clip.text_encoder, (SDXL,))
        part = _part(context, clip.text_encoder, (part,), SDXL)
        tokenizer_part = "tokenizer" if part == "text_encoder" else "tokenizer_2"
        if prompt == "":
            # InvokeAI's zero conditioning for an empty prompt, sized from the encoder's config without loading it
            # (the pooled width is the projection's, which is what the UNet takes).
            config = context.models.config(record, part)
            tokens, width = config["max_position_embeddings"], config["hidden_size"]
            hidden = torch.zeros(1, tokens, width, dtype=context.models.dtype, device=context.models.device)
            pooled = None
            if part == "text_encoder_2":
                projection = config.get("projection_dim") or width
                pooled = torch.zeros(1, projection, dtype=context.models.dtype, device=context.models.device)
            return hidden, pooled
        tokenizer_record = _sd_model(context, clip.tokenizer, (SDXL,))
        tokenizer = context.models.load(tokenizer_record, _part(context, clip.tokenizer, (tokenizer_part,), SDXL))
        with context.models.on_device(record, part) as text_encoder:
            output = generation.encode_with(text_encoder, tokenizer, prompt, context.models.device, clip.skipped_layers)
        return output.hidden, output.pooled

    def _target(self) -> tuple[int, int]:
        return self.target_height, self.target_width

    def invoke(self, context: InvocationContext) -> ConditioningOutput:
        import torch

        first, _ = self._encode(context, self.clip, self.prompt, "text_encoder")
        second_prompt = self.style if self.style.strip() else self.prompt
        second, pooled = self._encode(context, self.clip2, second_prompt, "text_encoder_2")
        if pooled is None:
            raise ValueError("clip2 gave no pooled projection: it must be an SDXL model's second text encoder")
        # Zero conditioning is sized by the config's context length: pad the shorter to the longer, as InvokeAI does.
        length = max(first.shape[1], second.shape[1])
        first, second = (_padded(part, length) for part in (first, second))
        embeds = torch.cat([first, second.to(first.dtype)], dim=-1)
        time_ids = torch.tensor(
            [[self.original_height, self.original_width, self.crop_top, self.crop_left, *self._target()]],
            dtype=torch.float32,
        )
        name = SDXL_COMPEL_CONDITIONING.save(context, embeds, pooled, time_ids)
        return ConditioningOutput(conditioning=ConditioningField(conditioning_name=name))


def _padded(embeds: torch.Tensor, length: int) -> torch.Tensor:
    import torch

    missing = length - embeds.shape[1]
    if missing <= 0:
        return embeds
    zeros = torch.zeros(embeds.shape[0], missing, embeds.shape[2], dtype=embeds.dtype, device=embeds.device)
    return torch.cat([embeds, zeros], dim=1)


# --- noise and denoise ---------------------------------------------------------------------------------------------


class NoiseOutput(BaseInvocationOutput):
    type: Literal["noise_output"] = "noise_output"
    noise: LatentsField = OutputField(description="Noise tensor")
    width: int = OutputField(description="Width of output (px)")
    height: int = OutputField(description="Height of output (px)")


LatentNoiseType = Literal["SD", "FLUX", "FLUX.2", "SD3", "CogView4", "Z-Image", "Anima"]


def _sd_noise_only(value: str) -> str:
    if value != "SD":
        raise ValueError(f"noise_type {value!r} is not made by this server's noise node yet; it makes 'SD' noise")
    return value


class NoiseInvocation(BaseInvocation):
    """Latent noise for SD-1 and SDXL: torch.randn(1, 4, height/8, width/8) from a generator seeded with `seed`, on
    the CPU (use_cpu) or the device, as InvokeAI and diffusers draw it."""

    type: Literal["noise"] = "noise"
    noise_type: Annotated[LatentNoiseType, AfterValidator(_sd_noise_only)] = InputField(
        default="SD", description="Architecture-specific noise type."
    )
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="Seed for random number generation")
    width: int = InputField(default=512, gt=0, le=MAX_DIMENSION, multiple_of=8, description="Width of output (px)")
    height: int = InputField(default=512, gt=0, le=MAX_DIMENSION, multiple_of=8, description="Height of output (px)")
    use_cpu: bool = InputField(
        default=True, description="Use CPU for noise generation (for reproducible results across platforms)"
    )

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_modulo(cls, value: Any) -> Any:
        # InvokeAI wraps any integer seed into its range instead of refusing it.
        return value % (SEED_MAX + 1) if isinstance(value, int) and not isinstance(value, bool) else value

    def invoke(self, context: InvocationContext) -> NoiseOutput:
        import torch

        device = torch.device("cpu") if self.use_cpu else context.models.device
        generator = torch.Generator(device=device).manual_seed(self.seed)
        shape = (1, 4, self.height // LATENT_SCALE, self.width // LATENT_SCALE)
        noise = torch.randn(shape, generator=generator, device=device, dtype=context.models.dtype).to("cpu")
        name = NOISE.save(context, noise)
        return NoiseOutput(noise=LatentsField(latents_name=name, seed=self.seed), width=self.width, height=self.height)


Conditioning = ConditioningField | Annotated[list[ConditioningField], Field(min_length=1)]


def _each_at_least_one(value: float | list[float]) -> float | list[float]:
    for scale in value if isinstance(value, list) else [value]:
        if scale < 1:
            raise ValueError("cfg_scale must be greater than 1")
    return value


class DenoiseLatentsInvocation(BaseInvocation):
    """Denoises noisy latents to decodable images (SD-1 or SDXL, by the UNet's model): text-to-image from `noise`,
    image-to-image from `latents` with `denoising_start`, on this server's SD denoise loop."""

    type: Literal["denoise_latents"] = "denoise_latents"
    positive_conditioning: Conditioning = InputField(
        description="Positive conditioning tensor (one, or a list from collect)", input=Input.CONNECTION
    )
    negative_conditioning: Conditioning = InputField(
        description="Negative conditioning tensor (one, or a list from collect)", input=Input.CONNECTION
    )
    noise: LatentsField | None = InputField(default=None, description="Noise tensor", input=Input.CONNECTION)
    steps: int = InputField(default=10, gt=0, le=1000, description="Number of steps to run")
    cfg_scale: Annotated[float | Annotated[list[float], Field(max_length=1000)], AfterValidator(_each_at_least_one)] = (
        InputField(
            default=7.5, description="Classifier-Free Guidance scale; a list gives one per step", title="CFG Scale"
        )
    )
    denoising_start: float = InputField(
        default=0.0, ge=0, le=1, description="When to start denoising, expressed a percentage of total steps"
    )
    denoising_end: float = InputField(
        default=1.0, ge=0, le=1, description="When to stop denoising, expressed a percentage of total steps"
    )
    scheduler: InvokeAISchedulerName = InputField(default="euler", description="Scheduler to use during inference")
    unet: UNetField = InputField(description="UNet (scheduler, LoRAs)", input=Input.CONNECTION, title="UNet")
    control: Annotated[Any, _none_only("ControlNets")] = InputField(default=None, input=Input.CONNECTION)
    ip_adapter: Annotated[Any, _none_only("IP-Adapters")] = InputField(
        default=None, description="IP-Adapter to apply", title="IP-Adapter", input=Input.CONNECTION
    )
    t2i_adapter: Annotated[Any, _none_only("T2I-Adapters")] = InputField(
        default=None, description="T2I-Adapter(s) to apply", title="T2I-Adapter", input=Input.CONNECTION
    )
    cfg_rescale_multiplier: float = InputField(
        default=0,
        ge=0,
        lt=1,
        description="Rescale multiplier for CFG guidance, used for models trained with zero-terminal SNR",
        title="CFG Rescale Multiplier",
    )
    hidiffusion: Annotated[bool, _off("HiDiffusion")] = InputField(
        default=False, description="Whether to apply HiDiffusion", title="HiDiffusion"
    )
    hidiffusion_raunet: bool = InputField(
        default=True, description="HiDiffusion: RAU-Net (unused while hidiffusion is off)"
    )
    hidiffusion_window_attn: bool = InputField(
        default=True, description="HiDiffusion: window attention (unused while hidiffusion is off)"
    )
    hidiffusion_t1_ratio: float = InputField(
        default=0.4, ge=0, le=1, description="HiDiffusion: T1 ratio (unused while hidiffusion is off)"
    )
    hidiffusion_t2_ratio: float = InputField(
        default=0.0, ge=0, le=1, description="HiDiffusion: T2 ratio (unused while hidiffusion is off)"
    )
    latents: LatentsField | None = InputField(default=None, description="Latents tensor", input=Input.CONNECTION)
    denoise_mask: Annotated[Any, _none_only("inpaint masks (denoise_mask)")] = InputField(
        default=None, description="A mask of the region to apply the denoising process to", input=Input.CONNECTION
    )

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        from invokeai.backend.families.sd_denoise import invokeai_start

        record = _sd_model(context, self.unet.unet)
        scheduler_record = _sd_model(context, self.unet.scheduler, (record.family,))
        noise = _load_any(context, self.noise.latents_name, (NOISE,), "noise")[1] if self.noise else None
        latents = _latents(context, self.latents) if self.latents else None
        reference = latents if latents is not None else noise
        if reference is None:
            raise ValueError("denoise_latents needs noise or latents (or both): connect the noise node's noise")
        height, width = (side * LATENT_SCALE for side in reference.shape[-2:])
        # The seed of the stochastic samplers' noise: the noise's, else the latents', else 0 (InvokeAI's order).
        seed = next((f.seed for f in (self.noise, self.latents) if f is not None and f.seed is not None), 0)
        scales = self.cfg_scale if isinstance(self.cfg_scale, list) else [self.cfg_scale]
        if isinstance(self.cfg_scale, list) and len(self.cfg_scale) != self.steps:
            raise ValueError(f"cfg_scale has {len(self.cfg_scale)} values; a list gives one per step ({self.steps})")
        guided = max(scales) > 1.0
        base = context.models.load(scheduler_record, "scheduler")
        # InvokeAI seeds dpmpp_sde's Brownian noise with the run's seed.
        overrides = {"noise_sampler_seed": seed} if self.scheduler.startswith("dpmpp_sde") else {}
        scheduler = make_sd_scheduler(self.scheduler, dict(base.config), **overrides)
        positive = _conditionings(context, record.family, self.positive_conditioning, width, height)
        negative = _conditionings(context, record.family, self.negative_conditioning, width, height)
        facts = {"width": width, "height": height, "guidance": guided}
        with context.models.on_device(record, "unet", **facts) as unet:
            start = invokeai_start(
                scheduler,
                steps=self.steps,
                denoising_start=self.denoising_start,
                denoising_end=self.denoising_end,
                noise=noise,
                latents=latents,
                seed=seed,
                device=context.models.device,
                dtype=context.models.dtype,
            )
            result = _denoise(context, record.family, unet, scheduler, start, positive, negative, guided, self)
        result = result.to("cpu")
        name = LATENTS[record.family].save(context, result)
        return LatentsOutput(latents=LatentsField(latents_name=name), width=width, height=height)


def _conditionings(
    context: InvocationContext, family: str, value: ConditioningField | list[ConditioningField], width: int, height: int
) -> tuple[Any, ...]:
    """One conditioning from one or several (collect's list): the token sequences side by side, as InvokeAI joins
    prompts without masks. SD-1: (embeds,); SDXL: (embeds, pooled, time ids), the pooled projection and time ids
    of the last one (InvokeAI's choice for prompts without masks); an sdxl_text_encoder's conditioning has the
    pipeline's time ids for this size."""
    import torch

    fields = value if isinstance(value, list) else [value]
    if family == SD1:
        parts = [_load_any(context, f.conditioning_name, (SD1_CONDITIONING,), "conditioning")[1] for f in fields]
        return (torch.cat(parts, dim=1),)
    embeds, pooled, time_ids = [], None, None
    for field in fields:
        kind, *tensors = _load_any(
            context, field.conditioning_name, (SDXL_COMPEL_CONDITIONING, SDXL_CONDITIONING), "conditioning"
        )
        embeds.append(tensors[0])
        pooled = tensors[1]
        time_ids = (
            tensors[2]
            if kind is SDXL_COMPEL_CONDITIONING
            else torch.tensor([[height, width, 0, 0, height, width]], dtype=torch.float32)
        )
    return torch.cat(embeds, dim=1), pooled, time_ids


def _denoise(
    context: InvocationContext,
    family: str,
    unet: Any,
    scheduler: Any,
    start: Any,
    positive: tuple[Any, ...],
    negative: tuple[Any, ...],
    guided: bool,
    node: DenoiseLatentsInvocation,
) -> torch.Tensor:
    if family == SD1:
        from invokeai.backend.families.sd1 import generation as sd1

        return sd1.denoise_from(
            unet,
            scheduler,
            start,
            positive=positive[0],
            negative=negative[0] if guided else None,
            cfg_scale=node.cfg_scale,
            device=context.models.device,
            dtype=context.models.dtype,
            cfg_rescale=node.cfg_rescale_multiplier,
            on_step=step_reporter(context, sd1.LATENT_RGB),
        )
    from invokeai.backend.families.sdxl import generation as sdxl

    dtype = context.models.dtype
    return sdxl.denoise_from(
        unet,
        scheduler,
        start,
        positive=sdxl.SdxlConditioning(positive[0].to(dtype=dtype), positive[1].to(dtype=dtype)),
        negative=sdxl.SdxlConditioning(negative[0].to(dtype=dtype), negative[1].to(dtype=dtype)) if guided else None,
        time_ids=positive[2],
        negative_time_ids=negative[2] if guided else None,
        cfg_scale=node.cfg_scale,
        cfg_rescale=node.cfg_rescale_multiplier,
        on_step=step_reporter(context, sdxl.LATENT_RGB),
    )


# --- VAE -----------------------------------------------------------------------------------------------------------


def _vae_source(context: InvocationContext, vae: VAEField) -> ModelRecord:
    """The record whose VAE a handle names: the model itself, or the pipeline a lone file pairs with."""
    record = _sd_model(context, vae.vae)
    _part(context, vae.vae, ("vae",), record.family)
    return provider(context, record, "vae")


def _generation(family: str) -> Any:
    import importlib

    return importlib.import_module(f"invokeai.backend.families.{'sd1' if family == SD1 else 'sdxl'}.generation")


class LatentsToImageInvocation(BaseInvocation):
    """Generates an image from latents with an SD-1 or SDXL VAE; `metadata` (core_metadata's) goes into the PNG."""

    type: Literal["l2i"] = "l2i"
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    latents: LatentsField = InputField(description="Latents tensor", input=Input.CONNECTION)
    vae: VAEField = InputField(description="VAE", input=Input.CONNECTION)
    tiled: NoTiling = InputField(
        default=False, description="Processing using overlapping tiles (reduce memory consumption)"
    )
    tile_size: int = InputField(
        default=0,
        ge=0,
        le=MAX_DIMENSION,
        multiple_of=8,
        description=TILE_SIZE_DESCRIPTION,
    )
    fp32: bool = InputField(default=False, description="Whether or not to use full float32 precision")

    def invoke(self, context: InvocationContext) -> ImageOutput:
        source = _vae_source(context, self.vae)
        latents = _latents(context, self.latents)
        height, width = (side * LATENT_SCALE for side in latents.shape[-2:])
        with context.models.on_device(source, "vae_decode", width=width, height=height) as vae:
            image = _generation(source.family).vae_decode(vae, latents, fp32=self.fp32)
        return ImageOutput.saved(context, image, metadata=self.metadata, board=self.board)


# InvokeAI's SDXL color compensation: the scale and offset of the normalised pixels before an SDXL VAE encodes.
SDXL_COMPENSATION = (1.015, -0.002)


class ImageToLatentsInvocation(BaseInvocation):
    """Encodes an image into latents with an SD-1 or SDXL VAE (sides trimmed to multiples of 8, as InvokeAI
    resizes them). The posterior sample is drawn with seed 0, so an encode is reproducible (InvokeAI draws it
    unseeded): the same latents as sd_vae_encode / sdxl_vae_encode with seed 0."""

    type: Literal["i2l"] = "i2l"
    image: ImageField = InputField(description="The image to encode")
    vae: VAEField = InputField(description="VAE", input=Input.CONNECTION)
    tiled: NoTiling = InputField(
        default=False, description="Processing using overlapping tiles (reduce memory consumption)"
    )
    tile_size: int = InputField(
        default=0,
        ge=0,
        le=MAX_DIMENSION,
        multiple_of=8,
        description=TILE_SIZE_DESCRIPTION,
    )
    fp32: bool = InputField(default=False, description="Whether or not to use full float32 precision")
    color_compensation: Literal["None", "SDXL"] = InputField(
        default="None", description="Apply VAE scaling compensation when encoding images (reduces color drift)."
    )

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        source = _vae_source(context, self.vae)
        image = context.load_image(self.image).convert("RGB")
        width, height = (side - side % LATENT_SCALE for side in image.size)
        if not width or not height:
            raise ValueError(f"image {self.image.image_name} is {image.width}x{image.height}; i2l needs 8x8 or more")
        options: dict[str, Any] = {"fp32": self.fp32}
        if self.color_compensation == "SDXL" and source.family == SDXL:
            options["compensation"] = SDXL_COMPENSATION
        with context.models.on_device(source, "vae_encode", width=width, height=height) as vae:
            latents = _generation(source.family).vae_encode(vae, image, 0, **options)
        name = LATENTS[source.family].save(context, latents.to("cpu"))
        return LatentsOutput(latents=LatentsField(latents_name=name), width=width, height=height)
