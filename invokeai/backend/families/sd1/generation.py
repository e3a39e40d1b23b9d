"""Stable Diffusion 1.x: prompt encoding, denoising (text-to-image and image-to-image) and VAE coding.

Each function computes what diffusers' StableDiffusionPipeline / StableDiffusionImg2ImgPipeline compute for one
image (no prompt weighting, clip skip, LoRA scale or guidance rescale), so for the same components, prompt, seed,
scheduler, steps and size the image is the pipeline's.
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from invokeai.backend.families.sd1.constants import LATENT_SCALE
from invokeai.backend.families.sd_schedulers import img2img_timesteps, step_kwargs
from invokeai.backend.generation.preview import RgbProjection
from invokeai.backend.generation.steps import StepCallback, fresh_scheduler, seeded_generator, seeded_noise

# Every SD-1 VAE downsamples by 8 (four blocks); the pipeline derives the same from the VAE config.
VAE_SCALE_FACTOR = LATENT_SCALE

# Linear map from the four SD-1.x latent channels to RGB in about [-1, 1]: a published least-squares fit of decoded
# pixels on latents. Good enough to see composition and colour in a step preview, at the cost of one matmul.
LATENT_RGB = RgbProjection(
    weights=torch.tensor(
        [
            [0.3444, 0.1385, 0.0670],
            [0.1247, 0.4027, 0.1494],
            [-0.3192, 0.2513, 0.2103],
            [-0.1307, -0.1874, -0.7445],
        ]
    ),
    bias=torch.zeros(3),
)


@torch.inference_mode()
def encode_prompt(text_encoder: Any, tokenizer: Any, prompt: str, device: torch.device | str) -> torch.Tensor:
    """CLIP conditioning (1, model_max_length, hidden) in the text encoder's dtype, on `device`.

    The negative ("unconditional") conditioning is the same call with the negative prompt; the pipeline's default is
    the empty string.
    """
    tokens = tokenizer(
        prompt, padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    )
    # SD-1 text encoders attend over the padding too; only a config that asks for the mask gets it.
    mask = tokens.attention_mask.to(device) if getattr(text_encoder.config, "use_attention_mask", False) else None
    hidden = text_encoder(tokens.input_ids.to(device), attention_mask=mask)[0]
    return hidden.to(device=device, dtype=text_encoder.dtype)


@torch.inference_mode()
def denoise(
    unet: Any,
    scheduler: Any,
    *,
    positive: torch.Tensor,
    negative: torch.Tensor,
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
) -> torch.Tensor:
    """Denoised latents (1, 4, height/8, width/8), ready for `vae_decode`.

    `scheduler` is one built with `invokeai.backend.models.sd1.make_scheduler` (a fresh copy is used, so it may be
    shared). Without `init_latents` this is text-to-image; with latents from `vae_encode(vae, image, seed)` it is
    image-to-image, starting `strength` of the way into the schedule. `on_step(step, total, latents)` runs after every
    step; `total` is the number of steps actually run.
    """
    if width % VAE_SCALE_FACTOR or height % VAE_SCALE_FACTOR:
        raise ValueError(f"width and height must be multiples of {VAE_SCALE_FACTOR}, got {width}x{height}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be within [0, 1], got {strength}")
    if unet.config.time_cond_proj_dim is not None:
        raise ValueError("UNets with a guidance embedding (time_cond_proj_dim, e.g. LCM) are not supported")
    device = torch.device(device)
    scheduler = fresh_scheduler(scheduler)
    generator = seeded_generator(seed)
    shape = (1, unet.config.in_channels, height // VAE_SCALE_FACTOR, width // VAE_SCALE_FACTOR)

    scheduler.set_timesteps(steps, device=device)
    if init_latents is None:
        timesteps = scheduler.timesteps
        latents = seeded_noise(shape, generator, device, dtype) * scheduler.init_noise_sigma
    else:
        if tuple(init_latents.shape) != shape:
            raise ValueError(f"init_latents have shape {tuple(init_latents.shape)}; {width}x{height} needs {shape}")
        timesteps = img2img_timesteps(scheduler, steps, strength)
        # The img2img pipeline drew the VAE posterior sample (vae_encode) from this same generator first; its noise
        # is the generator's next draw.
        seeded_noise(shape, generator, "cpu", dtype)
        noise = seeded_noise(shape, generator, device, dtype)
        start = timesteps[:1].repeat(shape[0])
        latents = scheduler.add_noise(init_latents.to(device=device, dtype=dtype), noise, start)

    guided = cfg_scale > 1.0
    conditioning = torch.cat([negative, positive]) if guided else positive
    conditioning = conditioning.to(device=device, dtype=dtype)
    extra_step_kwargs = step_kwargs(scheduler, generator)
    total = len(timesteps)
    for index, t in enumerate(timesteps):
        model_input = torch.cat([latents] * 2) if guided else latents
        model_input = scheduler.scale_model_input(model_input, t)
        noise_pred = unet(model_input, t, encoder_hidden_states=conditioning, return_dict=False)[0]
        if guided:
            uncond, cond = noise_pred.chunk(2)
            noise_pred = uncond + cfg_scale * (cond - uncond)
        latents = scheduler.step(noise_pred, t, latents, **extra_step_kwargs, return_dict=False)[0]
        if on_step is not None:
            on_step(index + 1, total, latents)
    return latents


def _image_processor(vae: Any) -> Any:
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=2 ** (len(vae.config.block_out_channels) - 1))


@torch.inference_mode()
def vae_decode(vae: Any, latents: torch.Tensor) -> Image.Image:
    """The RGB image the pipeline returns for these latents."""
    latents = latents.to(device=vae.device, dtype=vae.dtype)
    decoded = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
    return _image_processor(vae).postprocess(decoded, output_type="pil", do_denormalize=[True])[0]


@torch.inference_mode()
def vae_encode(vae: Any, image: Image.Image, seed: int) -> torch.Tensor:
    """Scaled latents of `image`, sampled from the VAE posterior with the seed's generator, as the img2img pipeline
    prepares them. Pass the same seed to `denoise`, whose noise then continues that generator's stream."""
    pixels = _image_processor(vae).preprocess(image).to(device=vae.device, dtype=vae.dtype)
    posterior = vae.encode(pixels).latent_dist
    return posterior.sample(seeded_generator(seed)) * vae.config.scaling_factor
