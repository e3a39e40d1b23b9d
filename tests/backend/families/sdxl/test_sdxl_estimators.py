"""The attention calls each SDXL estimator lists are the SDPA calls the real demo component makes (recorded around
scaled_dot_product_attention, with odd latent sides, guidance on and off, batches, short prompts), and an upcast
VAE is priced in fp32."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from invokeai.backend.cache.estimate import CallFacts, WorkingMemory
from invokeai.backend.families.sdxl import layout
from invokeai.backend.families.sdxl.constants import OPERATIONS
from invokeai.backend.families.sdxl.estimators import ESTIMATORS
from invokeai.backend.families.sdxl.runs import RUNS

CPU = torch.device("cpu")
CONFIGS = Path(layout.__file__).parent / "configs"
FACTS: dict[str, list[dict[str, Any]]] = {
    "text_encoder": [dict(batch=1), dict(batch=2, prompt_tokens=20)],
    "text_encoder_2": [dict(batch=1), dict(batch=2, prompt_tokens=20)],
    "unet": [dict(width=72, height=56), dict(width=64, height=64, batch=2, guidance=False)],
    "vae_decode": [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    "vae_encode": [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
}

Key = tuple[int, int, int, int, bool, bool]


def listed(memory: WorkingMemory) -> Counter[Key]:
    calls: Counter[Key] = Counter()
    for c in memory.attention_calls:
        calls[(c.num_heads, c.query_len, c.key_len, c.head_dim, c.has_attn_mask, c.is_causal)] += c.count
    return calls


def recorded(run: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> Counter[Key]:
    calls: Counter[Key] = Counter()
    real = F.scaled_dot_product_attention

    def recorder(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):  # type: ignore[no-untyped-def]
        heads = query.shape[0] * query.shape[1]
        calls[(heads, query.shape[-2], key.shape[-2], query.shape[-1], attn_mask is not None, bool(is_causal))] += 1
        return real(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorder)
    with torch.inference_mode():
        run()
    monkeypatch.setattr(F, "scaled_dot_product_attention", real)
    return calls


def test_every_operation_has_an_estimator_a_run_and_facts() -> None:
    assert set(OPERATIONS) == set(ESTIMATORS) == set(RUNS) == set(FACTS)


@pytest.mark.parametrize(
    ("operation", "overrides"),
    [pytest.param(op, o, id=f"{op}/{i}") for op, cases in FACTS.items() for i, o in enumerate(cases)],
)
def test_listed_calls_are_the_calls_the_demo_model_makes(
    sdxl_parts: dict[str, Any], monkeypatch: pytest.MonkeyPatch, operation: str, overrides: dict[str, Any]
) -> None:
    model = sdxl_parts[OPERATIONS[operation]]
    facts = CallFacts(CPU, torch.float32, **overrides)
    memory = ESTIMATORS[operation](model.config, facts)
    actual = recorded(RUNS[operation](model, facts, torch.Generator().manual_seed(0)), monkeypatch)
    assert actual == listed(memory)
    assert sum(actual.values()) > 0
    assert memory.activation_bytes > 0


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
