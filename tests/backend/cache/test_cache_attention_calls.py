"""The attention calls each estimator lists are the SDPA calls the real demo component makes: the forward pass runs
with scaled_dot_product_attention wrapped by a recorder, and the recorded shapes, masks and counts must equal the
estimator's list exactly (odd latent sizes, guidance on and off, batches, padded and full prompts)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from invokeai.backend.cache.component_runs import component_run
from invokeai.backend.cache.working_memory import ESTIMATORS, CallFacts, WorkingMemory, model_component
from invokeai.backend.families import FAMILIES

RUNS = {(family.name, operation) for family in FAMILIES for operation in family.runs}

CPU = torch.device("cpu")
# Each family's first whole-pipeline demo model (the one tests/backend/cache/conftest.py builds), by family.
DEMO_FOLDERS = {family.name: next(demo for demo in family.demos if demo.type == "main").filename for family in FAMILIES}

# (family, component) -> facts to check; sizes give odd latent sides (72x56 -> 9x7 -> 5x4).
FACTS: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("sd-1", "text_encoder"): [dict(batch=1), dict(batch=2, prompt_tokens=20)],
    ("sd-1", "unet"): [dict(width=72, height=56), dict(width=64, height=64, batch=2, guidance=False)],
    ("sd-1", "vae_decode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    ("sd-1", "vae_encode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    ("krea2", "text_encoder"): [dict(prompt_tokens=24), dict(prompt_tokens=24, text_padded=False, batch=2)],
    ("krea2", "transformer"): [dict(width=64, height=48, prompt_tokens=16), dict(width=32, height=32, batch=2)],
    ("krea2", "vae_decode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    ("flux", "text_encoder"): [dict(batch=1), dict(batch=2)],
    ("flux", "text_encoder_2"): [dict(prompt_tokens=256), dict(prompt_tokens=40, batch=2)],
    ("flux", "transformer"): [dict(width=80, height=48, prompt_tokens=24), dict(width=64, height=64, batch=2)],
    ("flux", "vae_decode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    ("flux", "vae_encode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    ("sdxl", "text_encoder"): [dict(batch=1), dict(batch=2, prompt_tokens=20)],
    ("sdxl", "text_encoder_2"): [dict(batch=1), dict(batch=2, prompt_tokens=20)],
    ("sdxl", "unet"): [dict(width=72, height=56), dict(width=64, height=64, batch=2, guidance=False)],
    ("sdxl", "vae_decode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    ("sdxl", "vae_encode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    # The masked text encoder (padded prompts), and the guided transformer batch whose captions pad to different
    # lengths (a mask) beside an unguided one.
    ("z-image", "text_encoder"): [dict(prompt_tokens=24), dict(prompt_tokens=40, batch=2)],
    ("z-image", "transformer"): [
        dict(width=80, height=48, prompt_tokens=60),
        dict(width=64, height=64, guidance=False),
    ],
    ("z-image", "vae_decode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    ("z-image", "vae_encode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    # An unpadded prompt (causal, grouped key-value heads) and a padded batch (a bool mask, K/V repeated); the
    # transformer's joint attention unmasked for one prompt and masked for a padded batch.
    ("qwen-image", "text_encoder"): [
        dict(prompt_tokens=50, text_padded=False),
        dict(prompt_tokens=60, batch=2),
        # Qwen-Image-Edit: the vision tower over two reference images' patches, then the text with their tokens.
        dict(prompt_tokens=130, text_padded=False, vision_patches=((12, 20), (8, 8))),
    ],
    ("qwen-image", "transformer"): [
        dict(width=80, height=48, prompt_tokens=20, text_padded=False),
        dict(width=64, height=64, prompt_tokens=24, batch=2),
        # Qwen-Image-Edit: two reference images' latents appended to the image tokens.
        dict(width=64, height=48, prompt_tokens=30, text_padded=False, reference_sizes=((96, 64), (48, 80))),
    ],
    ("qwen-image", "vae_decode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    ("qwen-image", "vae_encode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    # Qwen3 unpadded (causal, grouped key-value heads) and padded (a bool mask, K/V repeated); the adapter's masked
    # self- and cross-attention; the DiT's unmasked self-attention over the image and cross-attention to 512 tokens.
    ("anima", "text_encoder"): [dict(prompt_tokens=20, text_padded=False), dict(prompt_tokens=24, batch=2)],
    ("anima", "text_conditioner"): [dict(prompt_tokens=20), dict(prompt_tokens=16, batch=2)],
    ("anima", "transformer"): [dict(width=80, height=48), dict(width=64, height=64, batch=2)],
    ("anima", "vae_decode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    ("anima", "vae_encode"): [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
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


@pytest.fixture(scope="module")
def demo_models(demo_root: Path) -> dict[tuple[str, str], Any]:
    from invokeai.backend.models.loaders import load_component
    from invokeai.backend.models.probe import probe_model

    models = {}
    for family, folder in DEMO_FOLDERS.items():
        probe = probe_model(demo_root / folder)
        for fam, component in ESTIMATORS:
            if fam == family:
                models[(family, component)] = load_component(probe, model_component(family, component))
    return models


def test_every_estimator_has_a_run_and_facts_to_check() -> None:
    assert set(RUNS) == set(ESTIMATORS) == set(FACTS)


@pytest.mark.parametrize(
    ("family", "component", "overrides"),
    [
        pytest.param(family, component, overrides, id=f"{family}/{component}/{i}")
        for (family, component), cases in FACTS.items()
        for i, overrides in enumerate(cases)
    ],
)
def test_listed_calls_are_the_calls_the_demo_model_makes(
    demo_models: dict, monkeypatch: pytest.MonkeyPatch, family: str, component: str, overrides: dict
) -> None:
    model = demo_models[(family, component)]
    facts = CallFacts(CPU, torch.float32, **overrides)
    expected = listed(ESTIMATORS[(family, component)](model.config, facts))
    actual = recorded(component_run(family, component, model, facts), monkeypatch)
    assert actual == expected
    assert sum(actual.values()) > 0
