"""SDXL base: prompt encoding (two CLIP encoders), denoising (text-to-image and image-to-image) and VAE coding.

Each function computes what diffusers' StableDiffusionXLPipeline / StableDiffusionXLImg2ImgPipeline compute for one
image of a base model (no prompt weighting, clip skip, LoRA scale, guidance rescale, denoising_start/end, aesthetic
scores other than the img2img pipeline's defaults, or watermark), so for the same components, prompt, seed,
scheduler, steps and size the image is the pipeline's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from invokeai.backend.families.sd_denoise import DenoiseStart, Guidance, pipeline_start, run
from invokeai.backend.generation.preview import RgbProjection
from invokeai.backend.generation.steps import StepCallback, fresh_scheduler, seeded_generator, upcast

from .constants import LATENT_SCALE, SIZE_MULTIPLE

# Linear map from the four SDXL latent channels (scaled by the VAE's scaling factor) to RGB in about [-1, 1]: a
# published least-squares fit of SDXL VAE decodes on latents, for step previews at the cost of one matmul.
LATENT_RGB = RgbProjection(
    weights=torch.tensor(
        [
            [0.3651, 0.4232, 0.4341],
            [-0.2533, -0.0042, 0.1068],
            [0.1076, 0.1111, -0.0362],
            [-0.3165, -0.2492, -0.2188],
        ]
    ),
    bias=torch.tensor([0.1084, -0.0175, -0.0011]),
)


# StableDiffusionXLImg2ImgPipeline's aesthetic_score and negative_aesthetic_score defaults, the time ids a UNet
# trained on aesthetic scores (a model_index.json with requires_aesthetics_score) is conditioned on.
AESTHETIC_SCORE = 6.0
NEGATIVE_AESTHETIC_SCORE = 2.5


@dataclass(frozen=True)
class SdxlConditioning:
    """One prompt's conditioning: `embeds` (1, tokens, width 1 + width 2), both encoders' penultimate hidden states
    side by side; `pooled` (1, projection_dim), the second encoder's projected text embedding."""

    embeds: torch.Tensor
    pooled: torch.Tensor


@dataclass(frozen=True)
class EncoderOutput:
    """What one text encoder gives the conditioning: its penultimate hidden states, and its pooled output when it
    returns one first (CLIPTextModelWithProjection's text_embeds, (1, projection_dim))."""

    hidden: torch.Tensor
    pooled: torch.Tensor | None


@torch.inference_mode()
def encode_with(
    text_encoder: Any, tokenizer: Any, prompt: str, device: torch.device | str, skipped_layers: int = 0
) -> EncoderOutput:
    """One encoder's part of the conditioning, as the pipeline computes it: the prompt padded and truncated to the
    tokenizer's length, no attention mask, hidden_states[-2]. `skipped_layers` (InvokeAI's CLIP skip) computes it
    as InvokeAI does, with the encoder's last layers removed: the penultimate hidden state of what remains, and the
    pooled projection of what remains' last hidden state through the final layer norm."""
    tokens = tokenizer(
        prompt, padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    )
    input_ids = tokens.input_ids.to(device)
    output = text_encoder(input_ids, output_hidden_states=True)
    # The pipeline takes the pooled output from the encoder whose first output is 2-D (the projecting one).
    first = output[0]
    pooled = first if first.ndim == 2 else None
    if skipped_layers == 0:
        return EncoderOutput(hidden=output.hidden_states[-2], pooled=pooled)
    layers = len(output.hidden_states) - 1
    if skipped_layers > layers - 1:
        raise ValueError(f"CLIP skip {skipped_layers} leaves no penultimate layer of the encoder's {layers} layers")
    if pooled is not None:
        pooled = _projected(text_encoder, input_ids, output.hidden_states[-(skipped_layers + 1)])
    return EncoderOutput(hidden=output.hidden_states[-(skipped_layers + 2)], pooled=pooled)


def _projected(text_encoder: Any, input_ids: torch.Tensor, last_hidden: torch.Tensor) -> torch.Tensor:
    """CLIPTextModelWithProjection's text_embeds for a last hidden state: through the final layer norm, the end
    token's vector (transformers' pooling: the highest id for the original CLIP vocabulary, whose end token is its
    highest; else the first end token), projected."""
    model = text_encoder.text_model
    normed = model.final_layer_norm(last_hidden)
    eos = getattr(model, "eos_token_id", 2)
    index = input_ids.argmax(dim=-1) if eos == 2 else (input_ids == eos).int().argmax(dim=-1)
    pooled = normed[torch.arange(normed.shape[0], device=normed.device), index.to(normed.device)]
    return text_encoder.text_projection(pooled)


def join(
    first: EncoderOutput, second: EncoderOutput, dtype: torch.dtype, device: torch.device | str
) -> SdxlConditioning:
    """Both encoders' parts as the UNet's conditioning, in `dtype` (the pipeline uses text_encoder_2's)."""
    pooled = first.pooled if first.pooled is not None else second.pooled
    if pooled is None:
        raise ValueError(
            "neither text encoder returned a pooled projection; SDXL's second text encoder must be a "
            "CLIPTextModelWithProjection"
        )
    embeds = torch.cat([first.hidden, second.hidden], dim=-1).to(device=device, dtype=dtype)
    return SdxlConditioning(embeds=embeds, pooled=pooled.to(device=device))


def encode_prompt(
    text_encoder: Any,
    text_encoder_2: Any,
    tokenizer: Any,
    tokenizer_2: Any,
    prompt: str,
    device: torch.device | str,
    prompt_2: str | None = None,
) -> SdxlConditioning:
    """The conditioning for `prompt` (the first encoder) and `prompt_2` (the second; the pipeline's default: the
    same prompt). A negative prompt is the same call; a missing one under guidance is `denoise(negative=None)`."""
    first = encode_with(text_encoder, tokenizer, prompt, device)
    second = encode_with(text_encoder_2, tokenizer_2, prompt_2 or prompt, device)
    return join(first, second, text_encoder_2.dtype, device)


def add_time_ids(
    unet: Any,
    width: int,
    height: int,
    projection_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    aesthetic_score: float | None = None,
) -> torch.Tensor:
    """The micro-conditioning the pipeline passes by default: original size = target size = (height, width), crop
    (0, 0), (1, 6); with `aesthetic_score` (StableDiffusionXLImg2ImgPipeline when its requires_aesthetics_score is
    set) the score takes the target size's place, (1, 5). Checked against the UNet's add embedding width as the
    pipeline checks it."""
    ids: list[float] = [height, width, 0, 0]
    ids += [height, width] if aesthetic_score is None else [aesthetic_score]
    time_dim = unet.config.addition_time_embed_dim
    passed = time_dim * len(ids) + projection_dim
    expected = unet.add_embedding.linear_1.in_features
    if passed != expected:
        # One time id too many or too few: the UNet is (or is not) conditioned on an aesthetic score.
        hint = (
            "a UNet conditioned on an aesthetic score runs image-to-image only, where model_index.json sets "
            "requires_aesthetics_score, and a UNet without one only where it does not"
            if abs(passed - expected) == time_dim
            else "the text encoder does not belong to this UNet"
        )
        raise ValueError(
            f"the UNet's add embedding takes {expected} features, but {len(ids)} time ids x addition_time_embed_dim "
            f"{time_dim} + the text encoder's projection_dim {projection_dim} = {passed}: {hint}"
        )
    return torch.tensor([ids], dtype=dtype, device=device)


def check_size(width: int, height: int) -> None:
    if width <= 0 or height <= 0 or width % SIZE_MULTIPLE or height % SIZE_MULTIPLE:
        raise ValueError(f"width and height must be positive multiples of {SIZE_MULTIPLE}, got {width}x{height}")


@torch.inference_mode()
def denoise(
    unet: Any,
    scheduler: Any,
    *,
    positive: SdxlConditioning,
    negative: SdxlConditioning | None,
    width: int,
    height: int,
    steps: int,
    cfg_scale: float,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
    init_latents: torch.Tensor | None = None,
    strength: float = 1.0,
    on_step: StepCallback | None = None,
    projection_dim: int | None = None,
    requires_aesthetics_score: bool = False,
) -> torch.Tensor:
    """Denoised latents (1, 4, height/8, width/8), ready for `vae_decode`.

    `scheduler` is used through a fresh copy (it may be shared). `negative` None under guidance (cfg_scale > 1) is
    the pipeline's force_zeros_for_empty_prompt with no negative prompt: zero conditioning (where model_index.json
    sets it false, the caller passes the empty prompt's conditioning, as that pipeline encodes it). Without
    `init_latents` this is text-to-image; with latents from `vae_encode(vae, image, seed)` it is image-to-image,
    starting `strength` of the way into the schedule, and `requires_aesthetics_score` (model_index.json's, which
    only the img2img pipeline reads) conditions on the pipeline's default aesthetic scores instead of the target
    size. `projection_dim` is text_encoder_2's config projection_dim (what the pipeline reads; default: the pooled
    embedding's width, which equals it). `on_step(step, total, latents)` runs after every step; raising from it
    ends the run.
    """
    check_size(width, height)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be within [0, 1], got {strength}")
    _check_unet(unet)
    device = torch.device(device)
    scheduler = fresh_scheduler(scheduler)
    shape = (1, unet.config.in_channels, height // LATENT_SCALE, width // LATENT_SCALE)
    start = pipeline_start(
        scheduler,
        shape=shape,
        steps=steps,
        generator=seeded_generator(seed),
        device=device,
        dtype=dtype,
        init_latents=init_latents,
        strength=strength,
        begin_at_zero=True,
        require_steps=True,
    )
    guided = cfg_scale > 1.0
    if guided and negative is None:
        negative = SdxlConditioning(torch.zeros_like(positive.embeds), torch.zeros_like(positive.pooled))
    projection_dim = projection_dim if projection_dim is not None else int(positive.pooled.shape[-1])
    embed_dtype = positive.embeds.dtype
    aesthetic = requires_aesthetics_score and init_latents is not None
    scores = (AESTHETIC_SCORE, NEGATIVE_AESTHETIC_SCORE) if aesthetic else (None, None)
    time_ids = add_time_ids(unet, width, height, projection_dim, embed_dtype, device, scores[0])
    negative_time_ids = None
    if guided:
        negative_time_ids = add_time_ids(unet, width, height, projection_dim, embed_dtype, device, scores[1])
    return denoise_from(
        unet,
        scheduler,
        start,
        positive=positive,
        negative=negative if guided else None,
        time_ids=time_ids,
        negative_time_ids=negative_time_ids,
        cfg_scale=cfg_scale,
        on_step=on_step,
    )


def _check_unet(unet: Any) -> None:
    if unet.config.time_cond_proj_dim is not None:
        raise ValueError("UNets with a guidance embedding (time_cond_proj_dim, e.g. LCM) are not supported")


def check_time_ids(unet: Any, time_ids: torch.Tensor, projection_dim: int) -> None:
    """Refuse micro-conditioning of a width the UNet's add embedding does not take (a refiner's aesthetic-score
    time ids on a base UNet, or the reverse), as the pipeline checks it, rather than fail inside the UNet."""
    time_dim = unet.config.addition_time_embed_dim
    passed = time_dim * time_ids.shape[-1] + projection_dim
    expected = unet.add_embedding.linear_1.in_features
    if passed != expected:
        raise ValueError(
            f"the UNet's add embedding takes {expected} features, but {time_ids.shape[-1]} time ids x "
            f"addition_time_embed_dim {time_dim} + the pooled embedding's {projection_dim} = {passed}"
        )


@torch.inference_mode()
def denoise_from(
    unet: Any,
    scheduler: Any,
    start: DenoiseStart,
    *,
    positive: SdxlConditioning,
    negative: SdxlConditioning | None,
    time_ids: torch.Tensor,
    negative_time_ids: torch.Tensor | None,
    cfg_scale: float | Sequence[float],
    cfg_rescale: float = 0.0,
    on_step: StepCallback | None = None,
) -> torch.Tensor:
    """The latents the loop makes from `start` (sdxl_denoise's `pipeline_start`, or denoise_latents'
    `invokeai_start`, on this same `scheduler`). `time_ids` (1, n) are the micro-conditioning of the positive, and
    `negative_time_ids` of the negative; `negative` None: no guidance. `cfg_rescale` > 0 rescales the guidance
    (InvokeAI's cfg_rescale_multiplier)."""
    _check_unet(unet)
    device = start.latents.device
    guided = negative is not None
    if guided and negative_time_ids is None:
        raise ValueError("guidance needs the negative conditioning's time ids")
    check_time_ids(unet, time_ids, int(positive.pooled.shape[-1]))
    embed_dtype = positive.embeds.dtype
    time_ids = time_ids.to(device=device, dtype=embed_dtype)
    if guided:
        assert negative is not None and negative_time_ids is not None
        check_time_ids(unet, negative_time_ids, int(negative.pooled.shape[-1]))
        pooled = torch.cat([negative.pooled, positive.pooled]).to(device)
        both_time_ids = torch.cat([negative_time_ids.to(device=device, dtype=embed_dtype), time_ids])
    else:
        pooled = positive.pooled.to(device)

    def unet_kwargs(batched: bool) -> dict[str, Any]:
        if batched:
            return {"added_cond_kwargs": {"text_embeds": pooled, "time_ids": both_time_ids}}
        return {"added_cond_kwargs": {"text_embeds": pooled, "time_ids": time_ids}}

    guidance = Guidance(
        positive=positive.embeds.to(device),
        negative=negative.embeds.to(device) if negative is not None else None,
        cfg_scale=cfg_scale,
        rescale=cfg_rescale,
        unet_kwargs=unet_kwargs,
    )
    return run(unet, scheduler, start, guidance, on_step)


def _image_processor(vae: Any) -> Any:
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=2 ** (len(vae.config.block_out_channels) - 1))


def _latent_stats(vae: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The per-channel latent mean and std a VAE config may give (the pipelines use them instead of the scaling
    factor alone), shaped to broadcast over `like`; None when the config has neither."""
    mean = getattr(vae.config, "latents_mean", None)
    std = getattr(vae.config, "latents_std", None)
    if mean is None or std is None:
        return None

    def shaped(values: list[float]) -> torch.Tensor:
        return torch.tensor(values).view(1, -1, 1, 1).to(like.device, like.dtype)

    return shaped(mean), shaped(std)


def decode_upcasts(vae: Any) -> bool:
    """Whether decoding runs the VAE in fp32: the pipeline upcasts an fp16 VAE whose config sets force_upcast (the
    SDXL VAE overflows in fp16); bf16 and fp32 VAEs decode in their own dtype."""
    return vae.dtype == torch.float16 and bool(getattr(vae.config, "force_upcast", False))


def encode_upcasts(vae: Any) -> bool:
    """Whether encoding runs the VAE in fp32: the img2img pipeline upcasts whenever the config sets force_upcast."""
    return vae.dtype != torch.float32 and bool(getattr(vae.config, "force_upcast", False))


@torch.inference_mode()
def vae_decode(vae: Any, latents: torch.Tensor, fp32: bool = False) -> Image.Image:
    """The RGB image the pipeline returns for these latents. `fp32`: decode in float32 whatever the VAE's dtype
    (InvokeAI's l2i option)."""
    with upcast(vae, fp32 or decode_upcasts(vae)):
        latents = latents.to(device=vae.device, dtype=vae.dtype)
        stats = _latent_stats(vae, latents)
        if stats is not None:
            mean, std = stats
            latents = latents * std / vae.config.scaling_factor + mean
        else:
            latents = latents / vae.config.scaling_factor
        decoded = vae.decode(latents, return_dict=False)[0]
    return _image_processor(vae).postprocess(decoded, output_type="pil")[0]


@torch.inference_mode()
def vae_encode(
    vae: Any,
    image: Image.Image,
    seed: int,
    dtype: torch.dtype | None = None,
    fp32: bool = False,
    compensation: tuple[float, float] | None = None,
) -> torch.Tensor:
    """Scaled latents of `image` in `dtype` (default: the VAE's), sampled from the VAE posterior with the seed's
    generator, as the img2img pipeline prepares them. Pass the same seed to `denoise`, whose noise then continues
    that generator's stream. `fp32`: encode in float32 (InvokeAI's i2l option); `compensation`: (scale, offset) of
    the normalised pixels first (InvokeAI's SDXL colour compensation)."""
    dtype = dtype or vae.dtype
    pixels = _image_processor(vae).preprocess(image).to(device=vae.device, dtype=dtype)
    if compensation is not None:
        pixels = pixels * compensation[0] + compensation[1]
    active = fp32 or encode_upcasts(vae)
    with upcast(vae, active):
        if active:
            pixels = pixels.float()
        sample = vae.encode(pixels).latent_dist.sample(seeded_generator(seed))
    latents = sample.to(dtype)
    stats = _latent_stats(vae, latents)
    if stats is not None:
        mean, std = stats
        return (latents - mean) * vae.config.scaling_factor / std
    return vae.config.scaling_factor * latents
