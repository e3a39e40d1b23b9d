"""SDXL's estimators: the full-size UNet lists every transformer layer's attention, and an upcast VAE is priced in
fp32. (That each listed call is a call the real demo component makes is tests/backend/cache/test_cache_attention_calls,
for every family.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts
from invokeai.backend.families.sdxl import layout
from invokeai.backend.families.sdxl.estimators import ESTIMATORS

CPU = torch.device("cpu")
CONFIGS = Path(layout.__file__).parent / "configs"


def test_the_unet_lists_every_transformer_layer_of_the_full_size_config() -> None:
    """SDXL base at 1024 px: ten transformer layers per attention in the 1280-channel level (two down, the mid
    block, three up), two per attention at 640 channels (two down, three up); 64-wide heads; 77 text tokens in
    every cross-attention; none at 320 channels."""
    config = json.loads((CONFIGS / "sdxl" / "unet" / "config.json").read_text(encoding="utf-8"))
    calls = ESTIMATORS["unet"](config, CallFacts(CPU, torch.float16, width=1024, height=1024)).attention_calls
    by_shape = {(c.num_heads, c.query_len, c.key_len, c.head_dim): c.count for c in calls}
    # level 2 (32x32 latents, 20 heads): down 2 blocks x 10 + mid 10 + up 3 blocks x 10 = 60 layers
    assert by_shape[(40, 1024, 1024, 64)] == 60 and by_shape[(40, 1024, 77, 64)] == 60
    # level 1 (64x64 latents, 10 heads): down 2 x 2 + up 3 x 2 = 10 layers
    assert by_shape[(20, 4096, 4096, 64)] == 10 and by_shape[(20, 4096, 77, 64)] == 10
    assert len(by_shape) == 4


def test_an_fp16_vae_with_force_upcast_is_priced_in_fp32(sdxl_parts: dict[str, Any]) -> None:
    config = dict(sdxl_parts["vae"].config)
    facts16 = CallFacts(CPU, torch.float16, width=64, height=64)
    upcast = ESTIMATORS["vae_decode"](config, facts16)
    plain = ESTIMATORS["vae_decode"]({**config, "force_upcast": False}, facts16)
    fp32 = ESTIMATORS["vae_decode"](config, CallFacts(CPU, torch.float32, width=64, height=64))
    parameters = sum(p.numel() for p in sdxl_parts["vae"].parameters())
    assert upcast.activation_bytes == fp32.activation_bytes + 2 * parameters
    assert plain.activation_bytes < fp32.activation_bytes
