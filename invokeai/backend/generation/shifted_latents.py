"""Images to and from the latents of an AutoencoderKL whose config scales and shifts them (`scaling_factor`,
`shift_factor`), as diffusers' flow-matching pipelines on such a VAE code them (the 16-channel VAE of FLUX.1 and
the families that share it), and the step-preview map fitted to such a VAE.

`size_multiple` is what the family's denoiser needs the sides to be multiples of: the pipelines' image processor
rounds to it, and the caller checks an image against it before encoding.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

from invokeai.backend.generation.steps import seeded_generator

if TYPE_CHECKING:
    from PIL import Image

    from invokeai.backend.generation.preview import RgbProjection


def _image_processor(size_multiple: int) -> Any:
    from diffusers.image_processor import VaeImageProcessor

    # The pipelines' processor: sizes rounded to the denoiser's multiple, pixels in [-1, 1].
    return VaeImageProcessor(vae_scale_factor=size_multiple)


@torch.inference_mode()
def decode(vae: Any, latents: torch.Tensor, size_multiple: int) -> Image.Image:
    """The RGB image the pipeline returns for these (scaled and shifted) latents."""
    latents = latents.to(device=vae.device, dtype=vae.dtype)
    decoded = vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor, return_dict=False)[0]
    return _image_processor(size_multiple).postprocess(decoded, output_type="pil")[0]


@torch.inference_mode()
def encode(vae: Any, image: Image.Image, seed: int, size_multiple: int) -> torch.Tensor:
    """The latents the denoiser works in, sampled from the VAE posterior with the seed's generator, as the img2img
    pipelines prepare them. The family's denoise continues that generator's stream when given the same seed."""
    pixels = _image_processor(size_multiple).preprocess(image).to(torch.float32).to(device=vae.device, dtype=vae.dtype)
    sample = vae.encode(pixels).latent_dist.sample(seeded_generator(seed))
    return (sample - vae.config.shift_factor) * vae.config.scaling_factor


# One fitted preview map per VAE module, dropped with the module when the model cache lets it go.
_PREVIEW_MAPS: weakref.WeakKeyDictionary[Any, RgbProjection] = weakref.WeakKeyDictionary()


def known_preview_projection(vae: Any) -> RgbProjection | None:
    """The map `preview_projection` fitted for this VAE module earlier, if it did."""
    return _PREVIEW_MAPS.get(vae)


@torch.inference_mode()
def preview_projection(vae: Any) -> RgbProjection:
    """The map from denoiser latents to preview RGB for this VAE, fitted on first use (see `generation.preview`):
    it follows whatever VAE is installed, the demo's random one included. The caller puts the VAE on the execution
    device with working memory for FIT_COLOURS images of FIT_SIZE pixels."""
    from invokeai.backend.generation.preview import fit_rgb_projection

    projection = _PREVIEW_MAPS.get(vae)
    if projection is None:

        def encode_for_fit(images: torch.Tensor) -> torch.Tensor:
            z = vae.encode(images.to(device=vae.device, dtype=vae.dtype)).latent_dist.mode().float().cpu()
            return (z - vae.config.shift_factor) * vae.config.scaling_factor

        projection = _PREVIEW_MAPS[vae] = fit_rgb_projection(encode_for_fit)
    return projection
