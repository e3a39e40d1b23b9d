"""Stable Diffusion 1.x: prompt encoding, denoising (text-to-image and image-to-image) and VAE coding.

Each function computes what diffusers' StableDiffusionPipeline / StableDiffusionImg2ImgPipeline compute for one
image (no prompt weighting, clip skip, LoRA scale or guidance rescale), so for the same components, prompt, seed,
scheduler, steps and size the image is the pipeline's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from invokeai.backend.families.sd1.constants import LATENT_SCALE
from invokeai.backend.families.sd_denoise import DenoiseStart, Guidance, pipeline_start, run
from invokeai.backend.generation.preview import RgbProjection
from invokeai.backend.generation.steps import StepCallback, fresh_scheduler, seeded_generator, upcast

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
def encode_prompt(
    text_encoder: Any, tokenizer: Any, prompt: str, device: torch.device | str, skipped_layers: int = 0
) -> torch.Tensor:
    """CLIP conditioning (1, model_max_length, hidden) in the text encoder's dtype, on `device`.

    The negative ("unconditional") conditioning is the same call with the negative prompt; the pipeline's default is
    the empty string. `skipped_layers` (InvokeAI's CLIP skip) leaves out the encoder's last layers: the hidden state
    of the layer before them, through the final layer norm, as InvokeAI's compel node computes it with those layers
    removed.
    """
    tokens = tokenizer(
        prompt, padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    )
    # SD-1 text encoders attend over the padding too; only a config that asks for the mask gets it.
    mask = tokens.attention_mask.to(device) if getattr(text_encoder.config, "use_attention_mask", False) else None
    if skipped_layers == 0:
        hidden = text_encoder(tokens.input_ids.to(device), attention_mask=mask)[0]
    else:
        output = text_encoder(tokens.input_ids.to(device), attention_mask=mask, output_hidden_states=True)
        layers = len(output.hidden_states) - 1
        if skipped_layers > layers:
            raise ValueError(f"CLIP skip {skipped_layers} is more than the text encoder's {layers} layers")
        hidden = text_encoder.text_model.final_layer_norm(output.hidden_states[-(skipped_layers + 1)])
    return hidden.to(device=device, dtype=text_encoder.dtype)


def _check_unet(unet: Any) -> None:
    if unet.config.time_cond_proj_dim is not None:
        raise ValueError("UNets with a guidance embedding (time_cond_proj_dim, e.g. LCM) are not supported")


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

    `scheduler` is one built with the family's `make_scheduler` (a fresh copy is used, so it may be shared). Without
    `init_latents` this is text-to-image; with latents from `vae_encode(vae, image, seed)` it is image-to-image,
    starting `strength` of the way into the schedule. `on_step(step, total, latents)` runs after every step; `total`
    is the number of steps actually run.
    """
    if width % VAE_SCALE_FACTOR or height % VAE_SCALE_FACTOR:
        raise ValueError(f"width and height must be multiples of {VAE_SCALE_FACTOR}, got {width}x{height}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be within [0, 1], got {strength}")
    _check_unet(unet)
    device = torch.device(device)
    scheduler = fresh_scheduler(scheduler)
    shape = (1, unet.config.in_channels, height // VAE_SCALE_FACTOR, width // VAE_SCALE_FACTOR)
    start = pipeline_start(
        scheduler,
        shape=shape,
        steps=steps,
        generator=seeded_generator(seed),
        device=device,
        dtype=dtype,
        init_latents=init_latents,
        strength=strength,
    )
    return denoise_from(
        unet,
        scheduler,
        start,
        positive=positive,
        negative=negative,
        cfg_scale=cfg_scale,
        device=device,
        dtype=dtype,
        on_step=on_step,
    )


@torch.inference_mode()
def denoise_from(
    unet: Any,
    scheduler: Any,
    start: DenoiseStart,
    *,
    positive: torch.Tensor,
    negative: torch.Tensor | None,
    cfg_scale: float | Sequence[float],
    device: torch.device | str,
    dtype: torch.dtype,
    cfg_rescale: float = 0.0,
    on_step: StepCallback | None = None,
) -> torch.Tensor:
    """The latents the loop makes from `start` (sd_denoise's `pipeline_start`, or denoise_latents' `invokeai_start`
    on this same `scheduler`). Guidance runs where `cfg_scale` exceeds 1 (any step's, for a list with a scale per
    step) and needs `negative`; `cfg_rescale` > 0 rescales it (InvokeAI's cfg_rescale_multiplier)."""
    _check_unet(unet)
    scales = [cfg_scale] if isinstance(cfg_scale, int | float) else list(cfg_scale)
    guided = max(scales) > 1.0
    if guided and negative is None:
        raise ValueError("guidance (cfg_scale > 1) needs negative conditioning")
    guidance = Guidance(
        positive=positive.to(device=device, dtype=dtype),
        negative=negative.to(device=device, dtype=dtype) if guided and negative is not None else None,
        cfg_scale=cfg_scale,
        rescale=cfg_rescale,
    )
    return run(unet, scheduler, start, guidance, on_step)


def _image_processor(vae: Any) -> Any:
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=2 ** (len(vae.config.block_out_channels) - 1))


@torch.inference_mode()
def vae_decode(vae: Any, latents: torch.Tensor, fp32: bool = False) -> Image.Image:
    """The RGB image the pipeline returns for these latents. `fp32`: decode in float32 whatever the VAE's dtype
    (InvokeAI's l2i option)."""
    with upcast(vae, fp32):
        latents = latents.to(device=vae.device, dtype=vae.dtype)
        decoded = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
    return _image_processor(vae).postprocess(decoded, output_type="pil", do_denormalize=[True])[0]


@torch.inference_mode()
def vae_encode(vae: Any, image: Image.Image, seed: int, fp32: bool = False) -> torch.Tensor:
    """Scaled latents of `image`, sampled from the VAE posterior with the seed's generator, as the img2img pipeline
    prepares them. Pass the same seed to `denoise`, whose noise then continues that generator's stream. `fp32`:
    encode in float32 (InvokeAI's i2l option); the latents are in the VAE's own dtype either way."""
    dtype = vae.dtype
    with upcast(vae, fp32):
        pixels = _image_processor(vae).preprocess(image).to(device=vae.device, dtype=vae.dtype)
        posterior = vae.encode(pixels).latent_dist
        latents = posterior.sample(seeded_generator(seed)) * vae.config.scaling_factor
    return latents.to(dtype)
