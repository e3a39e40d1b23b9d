"""Qwen-Image: prompt encoding (the Qwen2.5-VL text model's last hidden state of the templated prompt), flow-matching
denoising with true classifier-free guidance (text-to-image and image-to-image), and coding with the 16-channel
AutoencoderKLQwenImage.

Each function computes what diffusers' QwenImagePipeline / QwenImageImg2ImgPipeline compute, step for step, so for
the same components, prompts, seed, steps, true CFG scale and size the images are the pipeline's. Prompts may come
in batches, as the pipeline takes them: prompts of different lengths are padded to the longest and the text encoder
and transformer then get a padding mask; a batch without padding gets none (diffusers 0.37+ passes the mask only
where there is padding, so unpadded calls stay eligible for the fused kernels that take no mask). The nodes run one
prompt at a time, which never pads.

Guidance follows the pipeline: `true_cfg_scale` above 1 with a negative prompt runs the transformer twice a step
(the positive, then the negative, each at the batch of images) and combines neg + s (pos - neg), rescaled to the
positive prediction's norm per token; without a negative prompt there is no guidance, whatever the scale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from invokeai.backend.families.qwen_image.constants import (
    LATENT_SCALE,
    MAX_SEQUENCE_LENGTH,
    PATCH,
    PROMPT_TEMPLATE,
    SHIFT_DEFAULTS,
    SIZE_MULTIPLE,
    TEMPLATE_PREFIX_TOKENS,
    TIMESTEP_SCALE,
    TOKENIZER_MAX_LENGTH,
    TRUE_CFG_SCALE,
)
from invokeai.backend.generation import normalized_latents
from invokeai.backend.generation.steps import StepCallback, fresh_scheduler, seeded_generator, seeded_noise

if TYPE_CHECKING:
    from PIL import Image


def text_model(text_encoder: Any) -> Any:
    """The module that computes the hidden states: Qwen2.5-VL's `model` under its language-model head. The pipeline
    calls the whole model with output_hidden_states and reads the last one, which is the text model's output; the
    head's logits (a vocabulary-wide row per token) and the other layers' states are never used, so the server
    neither computes nor keeps them."""
    return getattr(text_encoder, "model", text_encoder)


def tokenize(tokenizer: Any, prompts: Sequence[str], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) of the templated prompts, padded to the longest and cut at the pipeline's
    TOKENIZER_MAX_LENGTH tokens after the template prefix."""
    tokens = tokenizer(
        [PROMPT_TEMPLATE.format(prompt) for prompt in prompts],
        max_length=TOKENIZER_MAX_LENGTH + TEMPLATE_PREFIX_TOKENS,
        padding=True,
        truncation=True,
        return_tensors="pt",
    )
    return tokens.input_ids.to(device), tokens.attention_mask.to(device)


@torch.inference_mode()
def encode_prompt(
    text_encoder: Any,
    tokenizer: Any,
    prompt: str | Sequence[str],
    device: torch.device | str,
    *,
    max_sequence_length: int = MAX_SEQUENCE_LENGTH,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(embeddings (B, T, hidden) in the text encoder's dtype, mask (B, T) int64 or None).

    Each prompt's hidden states without the template prefix, the batch padded with zeros to its longest and cut to
    `max_sequence_length` tokens; the mask marks the real tokens and is None when none is padding. The negative
    prompt is the same call."""
    if not 1 <= max_sequence_length <= TOKENIZER_MAX_LENGTH:
        raise ValueError(f"max_sequence_length must be within [1, {TOKENIZER_MAX_LENGTH}], got {max_sequence_length}")
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    ids, mask = tokenize(tokenizer, prompts, device)
    hidden = text_model(text_encoder)(input_ids=ids, attention_mask=mask).last_hidden_state
    embeds, real = masked_embeddings(hidden, mask, TEMPLATE_PREFIX_TOKENS)
    if real is not None:
        real = real[:, :max_sequence_length]
        real = None if bool(real.all()) else real
    return embeds[:, :max_sequence_length].to(dtype=text_encoder.dtype, device=device), real


def masked_embeddings(hidden: torch.Tensor, mask: torch.Tensor, drop: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(embeddings, mask or None): each sequence's real tokens without its first `drop` (the template's system
    prefix), the batch padded with zeros to its longest; the mask marks the real tokens and is None when none is
    padding (the pipelines pass a mask only where there is padding)."""
    lengths = mask.bool().sum(dim=1).tolist()
    kept = [states[drop:] for states in torch.split(hidden[mask.bool()], lengths, dim=0)]
    longest = max(states.shape[0] for states in kept)
    embeds = torch.stack([torch.cat([s, s.new_zeros(longest - s.shape[0], s.shape[1])]) for s in kept])
    real = torch.stack(
        [torch.cat([torch.ones(s.shape[0], dtype=torch.long), torch.zeros(longest - s.shape[0], dtype=torch.long)])
         for s in kept]
    ).to(embeds.device)  # fmt: skip
    return embeds, (None if bool(real.all()) else real)


def image_shift(image_tokens: int, scheduler_config: Mapping[str, Any]) -> float:
    """The resolution-dependent shift mu the pipeline passes, linear in the image token count."""
    c = {key: scheduler_config.get(key, default) for key, default in SHIFT_DEFAULTS.items()}
    slope = (c["max_shift"] - c["base_shift"]) / (c["max_image_seq_len"] - c["base_image_seq_len"])
    return image_tokens * slope + (c["base_shift"] - slope * c["base_image_seq_len"])


def check_size(width: int, height: int) -> None:
    if width <= 0 or height <= 0 or width % SIZE_MULTIPLE or height % SIZE_MULTIPLE:
        raise ValueError(
            f"width and height must be positive multiples of {SIZE_MULTIPLE} (the VAE's 8 times the 2x2 patches), "
            f"got {width}x{height}"
        )


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> (B, h/2 * w/2, 4C): the transformer's tokens, 2x2 latent cells each."""
    b, c, h, w = latents.shape
    tokens = latents.view(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 2, 4, 1, 3, 5)
    return tokens.reshape(b, (h // PATCH) * (w // PATCH), c * PATCH * PATCH)


def unpack_latents(tokens: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """Inverse of `pack_latents` for an image of width x height pixels."""
    b, _, channels = tokens.shape
    h, w = height // LATENT_SCALE, width // LATENT_SCALE
    grid = tokens.view(b, h // PATCH, w // PATCH, channels // (PATCH * PATCH), PATCH, PATCH).permute(0, 3, 1, 4, 2, 5)
    return grid.reshape(b, channels // (PATCH * PATCH), h, w)


def _img2img_start(steps: int, strength: float) -> int:
    """The first step strength keeps, as QwenImageImg2ImgPipeline.get_timesteps counts it."""
    kept = min(steps * strength, steps)
    return int(max(steps - kept, 0))


def steps_run(steps: int, strength: float) -> int:
    """How many of `steps` a denoise of this strength runs (all of them from noise)."""
    return steps - _img2img_start(steps, strength)


def _guided(velocity: torch.Tensor, negative: torch.Tensor, scale: float) -> torch.Tensor:
    """True CFG as the pipeline combines it: neg + s (pos - neg), rescaled to the positive's norm per token."""
    combined = negative + scale * (velocity - negative)
    cond_norm = torch.norm(velocity, dim=-1, keepdim=True)
    noise_norm = torch.norm(combined, dim=-1, keepdim=True)
    return combined * (cond_norm / noise_norm)


@torch.inference_mode()
def denoise(
    transformer: Any,
    scheduler: Any,
    *,
    prompt_embeds: torch.Tensor,
    prompt_mask: torch.Tensor | None = None,
    negative_embeds: torch.Tensor | None = None,
    negative_mask: torch.Tensor | None = None,
    width: int,
    height: int,
    steps: int,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
    true_cfg_scale: float | Sequence[float] = TRUE_CFG_SCALE,
    init_latents: torch.Tensor | None = None,
    strength: float = 1.0,
    reference_latents: Sequence[torch.Tensor] = (),
    on_step: StepCallback | None = None,
) -> torch.Tensor:
    """Denoised latents (B, 16, height/8, width/8), in `dtype`, ready for `vae_decode`; B is the prompt batch.

    `prompt_embeds` / `negative_embeds` and their masks are `encode_prompt` outputs (the negative's batch as the
    prompt's). Guidance runs when `true_cfg_scale` > 1 and `negative_embeds` is given; a list gives one scale per
    step actually run (InvokeAI's per-step CFG), a step at 1 or less running the positive alone. Without
    `init_latents` this is text-to-image; with latents from `vae_encode(vae, image, seed)` it is image-to-image,
    `strength` of the way into the schedule. `dtype` is the transformer's compute dtype, which the latents are
    drawn and kept in, as the pipeline keeps them in its prompt embeddings' dtype. `reference_latents` (Qwen-Image-
    Edit's: `edit.encode_reference` outputs, (1, 16, h, w) each, any size) are packed and appended to the image
    tokens of every call, in order, as the Edit pipelines append them; the prediction is read off the generated
    tokens only. `on_step(step, total, latents)` gets unpacked latents after every step; `total` counts the steps
    actually run.
    """
    check_size(width, height)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be within [0, 1], got {strength}")
    batch = prompt_embeds.shape[0]
    if negative_embeds is not None and negative_embeds.shape[0] != batch:
        raise ValueError(f"{negative_embeds.shape[0]} negative prompts for {batch} prompts; give one per prompt")
    if getattr(transformer.config, "guidance_embeds", False):
        raise ValueError("a guidance-distilled transformer (guidance_embeds) needs a guidance scale the nodes lack")
    device = torch.device(device)
    scheduler = fresh_scheduler(scheduler)
    generator = seeded_generator(seed)
    channels = transformer.config.in_channels // (PATCH * PATCH)
    h, w = height // LATENT_SCALE, width // LATENT_SCALE
    noise_shape = (batch, 1, channels, h, w)  # the pipeline's (batch, frames, channels, h, w)
    for reference in reference_latents:
        if reference.dim() != 4 or reference.shape[0] != 1 or reference.shape[1] != channels:
            raise ValueError(
                f"reference latents have shape {tuple(reference.shape)}; the transformer takes (1, {channels}, h, w)"
            )
        if reference.shape[2] % PATCH or reference.shape[3] % PATCH:
            raise ValueError(
                f"reference latents of {reference.shape[3]}x{reference.shape[2]} cells do not pack into 2x2 patches; "
                f"encode the reference image at sides that are multiples of {SIZE_MULTIPLE}"
            )
    references = None
    if reference_latents:
        packed = [pack_latents(r.to(device=device, dtype=dtype)) for r in reference_latents]
        references = torch.cat(packed, dim=1).expand(batch, -1, -1)
    img_shapes = [
        [(1, h // PATCH, w // PATCH)] + [(1, r.shape[2] // PATCH, r.shape[3] // PATCH) for r in reference_latents]
    ] * batch

    sigmas = np.linspace(1.0, 1 / steps, steps)
    mu = image_shift((h // PATCH) * (w // PATCH), scheduler.config)
    scheduler.set_timesteps(sigmas=sigmas, device=device, mu=mu)
    if not torch.isfinite(scheduler.sigmas).all():
        # Qwen-Image's schedule stretches its sigmas to a terminal value, which one step divides by zero: the
        # pipeline would denoise to NaN and return a black image.
        raise ValueError(f"{steps} step(s) leave this model's schedule undefined (its shift_terminal); use more")
    if init_latents is None:
        timesteps = scheduler.timesteps
        scheduler.set_begin_index(0)
        noise = seeded_noise(noise_shape, generator, device, dtype)
        latents = pack_latents(noise[:, 0])
    else:
        if tuple(init_latents.shape[1:]) != (channels, h, w) or init_latents.shape[0] not in (1, batch):
            raise ValueError(
                f"init_latents have shape {tuple(init_latents.shape)}; {width}x{height} needs (1, {channels}, {h}, {w})"
            )
        start = _img2img_start(len(scheduler.timesteps), strength) * scheduler.order
        timesteps = scheduler.timesteps[start:]
        if len(timesteps) < 1:
            raise ValueError(f"strength {strength} with {steps} steps leaves no step to run; raise either")
        scheduler.set_begin_index(start)
        # The img2img pipeline drew the VAE posterior sample (vae_encode) from this same generator first; its noise
        # is the generator's next draw, of the same shape.
        seeded_noise((1, channels, 1, h, w), generator, "cpu", torch.float32)
        image = init_latents.to(device=device, dtype=dtype).expand(batch, -1, -1, -1).unsqueeze(1)
        noise = seeded_noise(noise_shape, generator, device, dtype)
        latents = pack_latents(scheduler.scale_noise(image, timesteps[:1].repeat(batch), noise)[:, 0])

    positive = (prompt_embeds.to(device=device, dtype=dtype), None if prompt_mask is None else prompt_mask.to(device))
    negative = None
    if negative_embeds is not None:
        negative = (
            negative_embeds.to(device=device, dtype=dtype),
            None if negative_mask is None else negative_mask.to(device),
        )

    def velocity(latents: torch.Tensor, conditioning: tuple[torch.Tensor, torch.Tensor | None], t: torch.Tensor) -> Any:
        embeds, mask = conditioning
        generated = latents.shape[1]
        if references is not None:
            latents = torch.cat([latents, references], dim=1)
        return transformer(
            hidden_states=latents,
            timestep=t / TIMESTEP_SCALE,
            guidance=None,
            encoder_hidden_states_mask=mask,
            encoder_hidden_states=embeds,
            img_shapes=img_shapes,
            attention_kwargs={},
            return_dict=False,
        )[0][:, :generated]

    total = len(timesteps)
    scales = [float(true_cfg_scale)] * total if isinstance(true_cfg_scale, int | float) else list(true_cfg_scale)
    if len(scales) != total:
        raise ValueError(f"{len(scales)} true CFG scales given for the {total} steps run; give one per step or one")
    for index, t in enumerate(timesteps):
        timestep = t.expand(batch).to(latents.dtype)
        prediction = velocity(latents, positive, timestep)
        if negative is not None and scales[index] > 1:
            prediction = _guided(prediction, velocity(latents, negative, timestep), scales[index])
        latents = scheduler.step(prediction, t, latents, return_dict=False)[0]
        if on_step is not None:
            on_step(index + 1, total, unpack_latents(latents, width, height))
    return unpack_latents(latents, width, height)


def vae_decode(vae: Any, latents: torch.Tensor) -> Image.Image:
    """The RGB image the pipeline returns for these (1, 16, h, w) latents."""
    return normalized_latents.decode(vae, latents, SIZE_MULTIPLE)[0]


def vae_decode_all(vae: Any, latents: torch.Tensor) -> list[Image.Image]:
    """One image per batch entry of `denoise`'s latents."""
    return normalized_latents.decode(vae, latents, SIZE_MULTIPLE)


def vae_encode(
    vae: Any, image: Image.Image, seed: int, *, width: int | None = None, height: int | None = None
) -> torch.Tensor:
    """The latents (1, 16, h, w) the img2img pipeline starts from: the image resized to width x height (its own
    size where unset), sampled from the VAE posterior with the seed's generator. Pass the same seed to `denoise`,
    whose noise continues that generator's stream."""
    check_size(width or image.width, height or image.height)
    return normalized_latents.encode(vae, image, seed, SIZE_MULTIPLE, width=width, height=height)


# The step-preview map is fitted to the VAE, the same way for every VAE of its kind.
known_preview_projection = normalized_latents.known_preview_projection
preview_projection = normalized_latents.preview_projection
