"""Qwen-Image-Edit and Edit-Plus: what their pipelines add to Qwen-Image's generation. The prompt is encoded with
the reference images (Qwen2.5-VL's vision tower sees them through the Qwen2-VL processor, and their image tokens stay
in the embeddings), and each reference image is encoded by the VAE (the posterior's mode) into latents that
`generation.denoise` appends to the image tokens.

Sizes follow the pipelines: a reference image is resized at its own aspect ratio to about REFERENCE_VAE_AREA pixels
(sides rounded to multiples of 32) for the VAE, whatever the output's size; Edit's vision tower sees that same image,
Edit-Plus's a copy resized to about REFERENCE_CONDITION_AREA pixels. Edit takes one reference image, Edit-Plus one
or more (its "Picture i:" labels number them). The pipeline class a folder's model_index.json names picks which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from invokeai.backend.families.qwen_image.constants import (
    EDIT_PIPELINE,
    EDIT_PLUS_PICTURE,
    EDIT_PLUS_PIPELINE,
    EDIT_PLUS_TEMPLATE,
    EDIT_TEMPLATE,
    EDIT_TEMPLATE_PREFIX_TOKENS,
    REFERENCE_CONDITION_AREA,
    REFERENCE_SIDE_MULTIPLE,
    REFERENCE_VAE_AREA,
    SIZE_MULTIPLE,
)

if TYPE_CHECKING:
    from PIL import Image

EDIT_PIPELINES = (EDIT_PIPELINE, EDIT_PLUS_PIPELINE)


def reference_size(width: int, height: int, area: int = REFERENCE_VAE_AREA) -> tuple[int, int]:
    """(width, height) the pipelines resize a width x height reference image to: about `area` pixels at its aspect
    ratio, each side rounded (half to even, as Python rounds) to a multiple of 32."""
    ratio = width / height
    new_width = math.sqrt(area * ratio)
    new_height = new_width / ratio
    side = REFERENCE_SIDE_MULTIPLE
    return round(new_width / side) * side, round(new_height / side) * side


def _resizer() -> Any:
    from diffusers.image_processor import VaeImageProcessor

    # The pipelines' image processor: PIL resizing with its default (Lanczos) filter, pixels to [-1, 1].
    return VaeImageProcessor(vae_scale_factor=SIZE_MULTIPLE)


def check_references(pipeline: str, count: int) -> None:
    """Refuse a reference count the pipeline cannot take (Edit: exactly one; Edit-Plus: at least one)."""
    if pipeline not in EDIT_PIPELINES:
        raise ValueError(f"{pipeline} takes no reference images; {' and '.join(EDIT_PIPELINES)} do")
    if count < 1:
        raise ValueError(f"{pipeline} needs a reference image; none was given")
    if pipeline == EDIT_PIPELINE and count != 1:
        raise ValueError(
            f"{EDIT_PIPELINE} takes one reference image, {count} were given ({EDIT_PLUS_PIPELINE} takes several)"
        )


def condition_images(pipeline: str, images: Sequence[Image.Image]) -> list[Image.Image]:
    """The images the vision tower sees, as the pipeline resizes them."""
    resizer = _resizer()
    area = REFERENCE_CONDITION_AREA if pipeline == EDIT_PLUS_PIPELINE else REFERENCE_VAE_AREA
    resized = []
    for image in images:
        width, height = reference_size(image.width, image.height, area)
        resized.append(resizer.resize(image, height, width))
    return resized


def templated(pipeline: str, prompt: str, references: int) -> str:
    if pipeline == EDIT_PLUS_PIPELINE:
        pictures = "".join(EDIT_PLUS_PICTURE.format(index + 1) for index in range(references))
        return EDIT_PLUS_TEMPLATE.format(pictures + prompt)
    return EDIT_TEMPLATE.format(prompt)


def processed(processor: Any, pipeline: str, prompts: Sequence[str], images: Sequence[Image.Image]) -> Any:
    """The processor's tensors (input_ids, attention_mask, pixel_values, image_grid_thw) for the prompts with these
    reference images, as the pipeline makes them."""
    check_references(pipeline, len(images))
    if pipeline == EDIT_PLUS_PIPELINE and len(prompts) != 1:
        raise ValueError(f"{EDIT_PLUS_PIPELINE} encodes one prompt at a time, {len(prompts)} were given")
    texts = [templated(pipeline, prompt, len(images)) for prompt in prompts]
    return processor(text=texts, images=condition_images(pipeline, images), padding=True, return_tensors="pt")


@torch.inference_mode()
def encode_prompt(
    text_encoder: Any,
    processor: Any,
    pipeline: str,
    prompt: str | Sequence[str],
    images: Sequence[Image.Image],
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(embeddings (B, T, hidden), mask (B, T) or None) of the prompts with the reference images: the Qwen2.5-VL
    text model's last hidden state without the system prefix, the image tokens kept, padded to the longest prompt
    (the Edit pipelines cut nothing). The negative prompt is the same call with the same images."""
    from invokeai.backend.families.qwen_image.generation import masked_embeddings, text_model

    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    inputs = processed(processor, pipeline, prompts, images).to(device)
    hidden = text_model(text_encoder)(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        pixel_values=inputs["pixel_values"],
        image_grid_thw=inputs["image_grid_thw"],
    ).last_hidden_state
    embeds, mask = masked_embeddings(hidden, inputs["attention_mask"], EDIT_TEMPLATE_PREFIX_TOKENS)
    return embeds.to(dtype=text_encoder.dtype, device=device), mask


def prompt_tokens(processor: Any, pipeline: str, prompt: str, images: Sequence[Image.Image]) -> int:
    """How many tokens the text model runs over for this prompt and these images (image tokens included)."""
    return int(processed(processor, pipeline, [prompt], images)["input_ids"].shape[1])


def vision_patches(processor: Any, pipeline: str, images: Sequence[Image.Image]) -> list[tuple[int, int]]:
    """(rows, columns) of patches the vision tower cuts each condition image into."""
    grids = processor.image_processor(images=condition_images(pipeline, images), return_tensors="pt")
    return [(int(h), int(w)) for _, h, w in grids["image_grid_thw"].tolist()]


@torch.inference_mode()
def encode_reference(
    vae: Any,
    image: Image.Image,
    *,
    width: int | None = None,
    height: int | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The normalised (1, C, h, w) latents the pipelines give the transformer for a reference image: the image
    resized to width x height (unset: `reference_size`), the VAE posterior's mode, (z - mean) / std. `dtype` is the
    dtype the pixels are cast to (the pipelines': their prompt embeddings'; the VAE's own by default)."""
    if width is None or height is None:
        width, height = reference_size(image.width, image.height)
    pixels = _resizer().preprocess(image, height, width).to(device=vae.device, dtype=dtype or vae.dtype).unsqueeze(2)
    latents = vae.encode(pixels).latent_dist.mode()
    z_dim = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(latents.device, latents.dtype)
    std = torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(latents.device, latents.dtype)
    return ((latents - mean) / std)[:, :, 0]
