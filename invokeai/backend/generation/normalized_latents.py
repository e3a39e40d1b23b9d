"""Images to and from the latents of a causal video VAE whose config normalises every latent channel
(`latents_mean`, `latents_std`, `z_dim`): diffusers' AutoencoderKLQwenImage, Wan-2.1's design, which the families
built on it share. An image is one video frame; the denoisers work in the normalised (B, C, h, w) latents.

The arithmetic is the pipelines' own, including their rounding: they divide by the reciprocal of the standard
deviation rather than multiply by it. The step-preview map fitted to such a VAE is here too.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

from invokeai.backend.generation.steps import seeded_generator

if TYPE_CHECKING:
    from PIL import Image

    from invokeai.backend.generation.preview import RgbProjection


def _statistics(vae: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, 1 / std), shaped (1, z_dim, 1, 1, 1) in `like`'s device and dtype, as the pipelines build them."""
    z_dim = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(like.device, like.dtype)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(like.device, like.dtype)
    return mean, inverse_std


def _image_processor(size_multiple: int, latent_channels: int | None = None) -> Any:
    from diffusers.image_processor import VaeImageProcessor

    # The pipelines' processor: sizes rounded to the denoiser's multiple, pixels in [-1, 1].
    if latent_channels is None:
        return VaeImageProcessor(vae_scale_factor=size_multiple)
    return VaeImageProcessor(vae_scale_factor=size_multiple, vae_latent_channels=latent_channels)


@torch.inference_mode()
def decode(vae: Any, latents: torch.Tensor, size_multiple: int) -> list[Image.Image]:
    """The RGB images the pipelines return for these normalised (B, C, h, w) latents, one per batch entry."""
    latents = latents.to(device=vae.device, dtype=vae.dtype).unsqueeze(2)  # one video frame
    mean, inverse_std = _statistics(vae, latents)
    decoded = vae.decode(latents / inverse_std + mean, return_dict=False)[0][:, :, 0]
    images: list[Image.Image] = _image_processor(size_multiple).postprocess(decoded, output_type="pil")
    return images


@torch.inference_mode()
def encode(
    vae: Any,
    image: Image.Image,
    seed: int,
    size_multiple: int,
    *,
    width: int | None = None,
    height: int | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The normalised (1, C, h, w) latents an image-to-image pipeline starts from: the image resized to width x
    height (its own size where unset) and rounded to `size_multiple`, as the pipeline's processor does, then a
    posterior sample drawn with the seed's generator. `dtype` is the pipeline's compute dtype the pixels are cast
    to (its prompt embeddings'; the VAE's own by default). The family's denoise continues that generator's stream
    when given the same seed."""
    processor = _image_processor(size_multiple, vae.config.z_dim)
    pixels = processor.preprocess(image, height=height, width=width).to(torch.float32)
    pixels = pixels.to(device=vae.device, dtype=dtype or vae.dtype).unsqueeze(2)
    sample = vae.encode(pixels).latent_dist.sample(seeded_generator(seed))
    mean, inverse_std = _statistics(vae, sample)
    return ((sample - mean) * inverse_std)[:, :, 0]


@torch.inference_mode()
def encode_mode(
    vae: Any, image: Image.Image, size_multiple: int, *, width: int | None = None, height: int | None = None
) -> torch.Tensor:
    """The normalised (1, C, h, w) latents of a pipeline that encodes with the posterior's mode and divides by the
    standard deviation (Anima's image-to-image: diffusers' `encode_vae_image` with sample_mode "argmax"): no seed,
    and the division's rounding rather than `encode`'s multiplication by the reciprocal."""
    processor = _image_processor(size_multiple, vae.config.z_dim)
    pixels = processor.preprocess(image, height=height, width=width).to(torch.float32)
    pixels = pixels.to(device=vae.device, dtype=vae.dtype).unsqueeze(2)
    mode = vae.encode(pixels).latent_dist.mode()
    z_dim = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(mode.device, mode.dtype)
    std = torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(mode.device, mode.dtype)
    return ((mode - mean) / std)[:, :, 0]


# One fitted preview map per VAE module, dropped with the module when the model cache lets it go.
_PREVIEW_MAPS: weakref.WeakKeyDictionary[Any, RgbProjection] = weakref.WeakKeyDictionary()


def known_preview_projection(vae: Any) -> RgbProjection | None:
    """The map `preview_projection` fitted for this VAE module earlier, if it did."""
    return _PREVIEW_MAPS.get(vae)


@torch.inference_mode()
def preview_projection(vae: Any) -> RgbProjection:
    """The map from denoiser latents to preview RGB for this VAE, fitted on first use (no published map exists for
    this latent space; see `generation.preview`) where the VAE is: the caller puts it on the execution device with
    working memory for FIT_COLOURS images of FIT_SIZE pixels."""
    from invokeai.backend.generation.preview import fit_rgb_projection

    projection = _PREVIEW_MAPS.get(vae)
    if projection is None:
        z_dim = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(1, z_dim, 1, 1)
        std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(1, z_dim, 1, 1)

        def encode_for_fit(images: torch.Tensor) -> torch.Tensor:
            frames = images.to(device=vae.device, dtype=vae.dtype).unsqueeze(2)  # one video frame
            z = vae.encode(frames).latent_dist.mode()[:, :, 0].float().cpu()
            return (z - mean) / std  # the normalised latents the transformer denoises

        projection = _PREVIEW_MAPS[vae] = fit_rgb_projection(encode_for_fit)
    return projection
