"""Step previews: a small RGB image from latents by one linear map, so a preview costs a matmul, not a VAE decode.

A family with a published map (SD-1) passes it in. For others the map is fitted to the model's own VAE: solid
colours are encoded, and a least-squares fit from every latent cell to the colour it came from gives weights and a
bias. It runs once per VAE, on small inputs, and follows whatever VAE (or fine-tune of one) is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from PIL import Image

PREVIEW_MAX_SIZE = 64
FIT_COLOURS = 48
FIT_SIZE = 32  # pixels a side: interior latent cells as well as border ones, and cheap for the largest VAE


@dataclass(frozen=True)
class RgbProjection:
    """rgb = latent @ weights + bias, per latent cell, with RGB in about [-1, 1]."""

    weights: torch.Tensor  # (channels, 3)
    bias: torch.Tensor  # (3,)

    @property
    def channels(self) -> int:
        return int(self.weights.shape[0])


def fit_colours(count: int = FIT_COLOURS) -> torch.Tensor:
    """(count, 3) colours in [-1, 1]: the eight corners of the RGB cube, mid grey, then a fixed spread of others."""
    corners = torch.tensor([[r, g, b] for r in (-1.0, 1.0) for g in (-1.0, 1.0) for b in (-1.0, 1.0)])
    grey = torch.zeros(1, 3)
    others = torch.rand(max(count - 9, 0), 3, generator=torch.Generator().manual_seed(0)) * 2 - 1
    return torch.cat([corners, grey, others])[:count]


@torch.inference_mode()
def fit_rgb_projection(encode: Callable[[torch.Tensor], torch.Tensor]) -> RgbProjection:
    """The least-squares map from latents to RGB for `encode`, which takes images (N, 3, FIT_SIZE, FIT_SIZE) in
    [-1, 1] and returns the latents the denoiser works in (N, C, h, w)."""
    colours = fit_colours()
    images = colours.view(-1, 3, 1, 1).expand(-1, -1, FIT_SIZE, FIT_SIZE).contiguous()
    latents = encode(images).float().cpu()
    # Every cell is a sample: border cells of a solid image differ from inner ones, and previews show both.
    cells = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
    targets = colours.repeat_interleave(latents.shape[2] * latents.shape[3], dim=0)
    design = torch.cat([cells, torch.ones(len(cells), 1)], dim=1)
    solution = torch.linalg.lstsq(design, targets).solution  # (C + 1, 3)
    return RgbProjection(weights=solution[:-1].contiguous(), bias=solution[-1].contiguous())


@torch.inference_mode()
def rgb_preview(latents: torch.Tensor, projection: RgbProjection) -> Image.Image:
    """The first image of `latents` (B, C, h, w) as RGB, one pixel per latent cell, at most PREVIEW_MAX_SIZE a side."""
    if latents.dim() != 4 or latents.shape[1] != projection.channels:
        raise ValueError(
            f"a preview needs latents (batch, {projection.channels}, height, width), got {tuple(latents.shape)}"
        )
    # It runs after every denoise step: one addmm and in-place ops (einsum and fresh temporaries cost 3x here).
    cells = latents[0].detach().to(device="cpu", dtype=torch.float32)
    channels, height, width = cells.shape
    rgb = torch.addmm(projection.bias, cells.reshape(channels, -1).T, projection.weights)
    pixels = rgb.add_(1.0).mul_(127.5).clamp_(0, 255).to(torch.uint8).reshape(height, width, 3)
    image = Image.fromarray(pixels.numpy())
    if max(height, width) > PREVIEW_MAX_SIZE:
        image.thumbnail((PREVIEW_MAX_SIZE, PREVIEW_MAX_SIZE))
    return image
