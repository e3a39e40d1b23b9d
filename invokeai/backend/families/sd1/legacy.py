"""What StableDiffusionPipeline.__init__ (and StableDiffusionImg2ImgPipeline's, the same code) corrects in an old
folder's configs, with a deprecation warning, before it runs anything: the descriptor's `config_rewrites`, which the
loader applies to the components it loads, so an old SD-1 folder samples as the stock pipeline samples it.

(diffusers 0.42.1, pipelines/stable_diffusion/pipeline_stable_diffusion.py lines 214-239 and 257-284; the Img2Img
pipeline's lines 242-312.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The sample size early SD-1 UNet configs understated (32, in latent cells); the pipeline assumes 64 for them.
LEGACY_SAMPLE_SIZE = 64
# UNet configs written before this diffusers release are the ones whose sample_size the pipeline distrusts.
LEGACY_UNET_VERSION = "0.9.0.dev0"


def scheduler_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """steps_offset other than 1 becomes 1, and clip_sample true becomes false: configs written for diffusers'
    first releases have steps_offset 0 and clip_sample true, and sample with a shifted schedule and clipped x0
    (a ruined image under DDIM, DDPM and LCM) unless corrected. A key the config lacks stays absent."""
    rewritten = dict(config)
    if rewritten.get("steps_offset", 1) != 1:
        rewritten["steps_offset"] = 1
    # `is True`, as the pipeline tests it: a truthy non-bool (1) is left alone.
    if rewritten.get("clip_sample", False) is True:
        rewritten["clip_sample"] = False
    return rewritten


def unet_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """sample_size below 64 in a UNet config written before diffusers 0.9 becomes 64. The server's nodes always
    give the size, so this changes no image; it keeps the UNet's config the pipeline's (the default image size
    it implies, 512, is what such a model was trained at)."""
    from packaging import version

    rewritten = dict(config)
    written_by = rewritten.get("_diffusers_version")
    sample_size = rewritten.get("sample_size")
    if (
        isinstance(written_by, str)
        and isinstance(sample_size, int)
        and sample_size < LEGACY_SAMPLE_SIZE
        and version.parse(version.parse(written_by).base_version) < version.parse(LEGACY_UNET_VERSION)
    ):
        rewritten["sample_size"] = LEGACY_SAMPLE_SIZE
    return rewritten


REWRITES = {"scheduler": scheduler_config, "unet": unet_config}
