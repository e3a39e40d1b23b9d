"""Step previews: one linear map from latents to RGB, published (SD-1) or fitted to the model's own VAE (Krea-2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from invokeai.backend.generation.preview import (
    FIT_SIZE,
    PREVIEW_MAX_SIZE,
    RgbProjection,
    fit_colours,
    fit_rgb_projection,
    rgb_preview,
)


def _linear_encoder(mix: torch.Tensor, offset: torch.Tensor):  # type: ignore[no-untyped-def]
    """An encoder whose latents are exactly mix @ rgb + offset per 8x8 cell: the fit must invert it."""

    def encode(images: torch.Tensor) -> torch.Tensor:
        assert images.shape[1:] == (3, FIT_SIZE, FIT_SIZE)
        assert float(images.min()) >= -1.0 and float(images.max()) <= 1.0
        cells = torch.nn.functional.avg_pool2d(images, 8)  # (N, 3, 2, 2)
        return torch.einsum("cr,nrhw->nchw", mix, cells) + offset.view(1, -1, 1, 1)

    return encode


# With as many channels as colours, only the bias can undo the encoder's offset; with more, a linear map alone could.
@pytest.mark.parametrize("channels", [3, 6])
def test_the_fit_recovers_the_colour_of_latents_from_a_linear_encoder(channels: int) -> None:
    generator = torch.Generator().manual_seed(1)
    mix = torch.randn(channels, 3, generator=generator)
    offset = torch.randn(channels, generator=generator)
    projection = fit_rgb_projection(_linear_encoder(mix, offset))
    assert projection.channels == channels
    colour = torch.tensor([0.8, -0.2, 0.4])  # not one of the fitted colours
    latents = (mix @ colour + offset).view(1, channels, 1, 1).expand(1, channels, 4, 4)
    pixels = np.asarray(rgb_preview(latents, projection)).reshape(-1, 3).astype(float)
    expected = (colour.numpy() + 1.0) * 127.5
    assert np.abs(pixels - expected).max() <= 1.0


def test_fit_colours_span_the_cube_and_repeat() -> None:
    colours = fit_colours()
    assert colours.shape == (48, 3) and float(colours.min()) == -1.0 and float(colours.max()) == 1.0
    assert torch.equal(colours, fit_colours())  # the same fit on every start


def test_a_preview_is_one_pixel_per_latent_cell_at_most_the_preview_size() -> None:
    projection = RgbProjection(weights=torch.eye(3)[:, :3].repeat(2, 1)[:5], bias=torch.zeros(3))
    assert rgb_preview(torch.zeros(2, 5, 6, 10), projection).size == (10, 6)
    large = rgb_preview(torch.zeros(1, 5, 128, 96), projection)
    assert max(large.size) <= PREVIEW_MAX_SIZE and large.size == (48, 64)  # PIL sizes are (width, height)


def test_latents_of_the_wrong_shape_are_refused_by_name() -> None:
    projection = RgbProjection(weights=torch.zeros(16, 3), bias=torch.zeros(3))
    with pytest.raises(ValueError, match=r"needs latents \(batch, 16, height, width\), got \(1, 4, 8, 8\)"):
        rgb_preview(torch.zeros(1, 4, 8, 8), projection)
