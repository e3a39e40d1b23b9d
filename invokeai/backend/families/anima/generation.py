"""Anima: prompt encoding (the Qwen3 text model's last hidden state, and the T5 token ids the adapter's queries
are), text conditioning (AnimaTextConditioner: the queries attend to the Qwen3 states, padded to 512 tokens),
flow-matching denoising with classifier-free guidance (text-to-image and image-to-image), and coding with the
Qwen-Image VAE.

Each function computes what diffusers' AnimaModularPipeline (AnimaAutoBlocks) computes, step for step, so for the
same components, prompts, seed, steps, guidance scale and size the images are the pipeline's with its guider
ClassifierFreeGuidance at that scale. Guidance follows that guider: above 1 the transformer runs twice a step, the
positive and then the negative conditioning, each at batch 1, combined as neg + s (pos - neg); at 1 the positive
alone. The pipeline's negative prompt, when none is given, is "": the nodes encode it like any other.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from invokeai.backend.families.anima.constants import LATENT_SCALE, MAX_SEQUENCE_LENGTH, SIZE_MULTIPLE
from invokeai.backend.generation import normalized_latents
from invokeai.backend.generation.steps import StepCallback, fresh_scheduler, seeded_generator, seeded_noise

if TYPE_CHECKING:
    from PIL import Image


def tokenize(tokenizer: Any, prompt: str, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) of `prompt`, cut at MAX_SEQUENCE_LENGTH tokens. A prompt of no tokens (Qwen's
    tokenizer adds none to "") becomes one padding token, masked out, as the pipeline makes it."""
    tokens = tokenizer(
        [prompt], padding="longest", max_length=MAX_SEQUENCE_LENGTH, truncation=True, return_tensors="pt"
    )
    ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
    if ids.shape[-1] == 0:
        ids, mask = ids.new_zeros((1, 1)), mask.new_zeros((1, 1))
    return ids, mask


@torch.inference_mode()
def encode_prompt(
    text_encoder: Any, tokenizer: Any, t5_tokenizer: Any, prompt: str, device: torch.device | str
) -> dict[str, torch.Tensor]:
    """The prompt as the adapter takes it: `qwen_embeds` (1, L, hidden) in the text encoder's dtype, zero where
    masked; `qwen_mask` (1, L); `t5_ids` and `t5_mask` (1, T), the adapter's query tokens. The negative prompt is
    the same call."""
    ids, mask = tokenize(tokenizer, prompt, device)
    hidden = text_encoder(input_ids=ids, attention_mask=mask, output_hidden_states=False).last_hidden_state
    hidden = hidden.to(dtype=text_encoder.dtype, device=device) * mask.to(hidden).unsqueeze(-1)
    t5_ids, t5_mask = tokenize(t5_tokenizer, prompt, device)
    return {"qwen_embeds": hidden, "qwen_mask": mask, "t5_ids": t5_ids, "t5_mask": t5_mask}


@torch.inference_mode()
def condition(
    text_conditioner: Any, encoded: dict[str, torch.Tensor], device: torch.device | str, dtype: torch.dtype
) -> torch.Tensor:
    """The DiT's cross-attention context (1, >= 512, text_embed_dim) in `dtype` (the transformer's): the adapter's
    queries (the T5 token ids) attending to the Qwen3 states, both masked, the output zero past the T5 tokens and
    padded to the adapter's min_sequence_length."""
    embeds = text_conditioner(
        source_hidden_states=encoded["qwen_embeds"].to(device=device, dtype=text_conditioner.dtype),
        target_input_ids=encoded["t5_ids"].to(device),
        target_attention_mask=encoded["t5_mask"].to(device),
        source_attention_mask=encoded["qwen_mask"].to(device),
    )
    return embeds.to(device=device, dtype=dtype)


def check_size(width: int, height: int) -> None:
    if width <= 0 or height <= 0 or width % SIZE_MULTIPLE or height % SIZE_MULTIPLE:
        raise ValueError(
            f"width and height must be positive multiples of {SIZE_MULTIPLE} (the VAE's 8 times the 2x2 patches), "
            f"got {width}x{height}"
        )


def _nearest_resize(mask: torch.Tensor, size: list[int], interpolation: Any = None) -> torch.Tensor:
    return torch.nn.functional.interpolate(mask, size=tuple(size), mode="nearest")


def padding_mask_resize() -> None:
    """Let CosmosTransformer3DModel concatenate its padding mask without torchvision. Anima's transformer sets
    `concat_padding_mask`, and diffusers resizes that mask to the latent grid with torchvision's nearest resize,
    a name it leaves undefined when torchvision is missing (this server does not install it: no torchvision wheel
    installs beside its CPU torch). Nearest resizing a tensor is torch's own nearest interpolation, which is what
    torchvision calls for tensors; and the mask the pipeline passes is all zeros, which any resize keeps zero."""
    from diffusers.models.transformers import transformer_cosmos

    if not hasattr(transformer_cosmos, "transforms"):
        functional = types.SimpleNamespace(resize=_nearest_resize)
        transformer_cosmos.transforms = types.SimpleNamespace(  # type: ignore[attr-defined]
            functional=functional, InterpolationMode=types.SimpleNamespace(NEAREST="nearest")
        )


def _img2img_start(steps: int, strength: float) -> int:
    """The first step strength keeps, as the pipeline's get_timesteps counts it."""
    kept = min(steps * strength, steps)
    return int(max(steps - kept, 0))


def steps_run(steps: int, strength: float) -> int:
    """How many of `steps` a denoise of this strength runs (all of them from noise)."""
    return steps - _img2img_start(steps, strength)


@torch.inference_mode()
def denoise(
    transformer: Any,
    scheduler: Any,
    *,
    prompt_embeds: torch.Tensor,
    negative_embeds: torch.Tensor | None = None,
    width: int,
    height: int,
    steps: int,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
    guidance_scale: float | Sequence[float] = 1.0,
    init_latents: torch.Tensor | None = None,
    strength: float = 1.0,
    on_step: StepCallback | None = None,
) -> torch.Tensor:
    """Denoised latents (1, 16, height/8, width/8), float32, ready for `vae_decode`.

    `prompt_embeds` / `negative_embeds` are `condition` outputs. Guidance runs when `guidance_scale` > 1, against
    `negative_embeds` (required then); a list gives one scale per step actually run. Without `init_latents` this is
    text-to-image; with latents from `vae_encode(vae, image)` it is image-to-image, `strength` of the way into the
    schedule. The latents are drawn and stepped in float32, as the pipeline keeps them, and given to the
    transformer in `dtype`. `on_step(step, total, latents)` gets the latents after every step; `total` counts the
    steps actually run.
    """
    check_size(width, height)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be within [0, 1], got {strength}")
    device = torch.device(device)
    scheduler = fresh_scheduler(scheduler)
    generator = seeded_generator(seed)
    channels = transformer.config.in_channels
    h, w = height // LATENT_SCALE, width // LATENT_SCALE
    if transformer.config.concat_padding_mask:
        padding_mask_resize()

    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), device=device)
    if init_latents is None:
        timesteps = scheduler.timesteps
        scheduler.set_begin_index(0)
        latents = seeded_noise((1, channels, 1, h, w), generator, device, torch.float32)
    else:
        if tuple(init_latents.shape) != (1, channels, h, w):
            raise ValueError(
                f"init_latents have shape {tuple(init_latents.shape)}; {width}x{height} needs (1, {channels}, {h}, {w})"
            )
        start = _img2img_start(len(scheduler.timesteps), strength) * scheduler.order
        timesteps = scheduler.timesteps[start:]
        if len(timesteps) < 1:
            raise ValueError(f"strength {strength} with {steps} steps leaves no step to run; raise either")
        scheduler.set_begin_index(start)
        image = init_latents.to(device=device, dtype=torch.float32).unsqueeze(2)
        noise = seeded_noise(tuple(image.shape), generator, device, torch.float32)
        latents = scheduler.scale_noise(image, timesteps[:1].repeat(1), noise)

    total = len(timesteps)
    scales = [float(guidance_scale)] * total if isinstance(guidance_scale, int | float) else list(guidance_scale)
    if len(scales) != total:
        raise ValueError(f"{len(scales)} guidance scales given for the {total} steps run; give one per step or one")
    if negative_embeds is None and any(scale > 1 for scale in scales):
        raise ValueError('guidance above 1 needs negative embeddings (the pipeline encodes "" when none is given)')
    positive = prompt_embeds.to(device=device, dtype=dtype)
    negative = None if negative_embeds is None else negative_embeds.to(device=device, dtype=dtype)
    # The pipeline's padding mask: none of the image is padding (zeros at the pixel size, in the DiT's dtype).
    padding = torch.zeros(1, 1, height, width, device=device, dtype=dtype)

    def velocity(model_input: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return transformer(
            hidden_states=model_input,
            timestep=timestep,
            encoder_hidden_states=context,
            padding_mask=padding,
            return_dict=False,
        )[0]

    train_steps = scheduler.config.num_train_timesteps
    # A stochastic sampler (LCM) draws fresh noise in its step: from the seed's generator, after the initial noise.
    step_kwargs = {"generator": generator} if "generator" in inspect.signature(scheduler.step).parameters else {}
    for index, t in enumerate(timesteps):
        model_input = latents.to(dtype)
        timestep = t.expand(1).to(dtype) / train_steps
        prediction = velocity(model_input, timestep, positive)
        if scales[index] > 1 and negative is not None:
            unconditional = velocity(model_input, timestep, negative)
            prediction = unconditional + scales[index] * (prediction - unconditional)
        latents = scheduler.step(prediction, t, latents, return_dict=False, **step_kwargs)[0]
        if on_step is not None:
            on_step(index + 1, total, latents[:, :, 0])
    return latents[:, :, 0]


def vae_decode(vae: Any, latents: torch.Tensor) -> Image.Image:
    """The RGB image the pipeline returns for these (1, 16, h, w) latents."""
    return normalized_latents.decode(vae, latents, SIZE_MULTIPLE)[0]


def vae_encode(vae: Any, image: Image.Image, *, width: int | None = None, height: int | None = None) -> torch.Tensor:
    """The latents (1, 16, h, w) the image-to-image pipeline starts from: the image resized to width x height (its
    own size where unset), the VAE posterior's mode (the pipeline samples none: no seed)."""
    check_size(width or image.width, height or image.height)
    return normalized_latents.encode_mode(vae, image, SIZE_MULTIPLE, width=width, height=height)


# The step-preview map is fitted to the VAE, the same way for every VAE of its kind.
known_preview_projection = normalized_latents.known_preview_projection
preview_projection = normalized_latents.preview_projection
