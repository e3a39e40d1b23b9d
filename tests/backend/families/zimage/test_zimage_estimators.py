"""Z-Image's working-memory estimators: the attention calls each lists are the SDPA calls the real demo component
makes (in its calibration run and in a real guided generation step: the text encoder's masked grouped-query calls,
the transformer's masked CFG batch), the full-size numbers come out as the architecture says, and the estimates lie
within 1.0-1.3 times the peak `scripts/calibrate_working_memory.py` measures for the demo architecture."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from invokeai.backend.attention.testing import pristine_attention
from invokeai.backend.cache.estimate import CallFacts, WorkingMemory
from invokeai.backend.families.zimage import estimators, generation, runs
from invokeai.backend.families.zimage.descriptor import CONFIG_VARIANTS, FAMILY

CPU = torch.device("cpu")
VARIANTS = {variant.name: variant for variant in CONFIG_VARIANTS}
ROOT = Path(__file__).resolve().parents[4]
SCRIPT = ROOT / "scripts" / "calibrate_working_memory.py"
Key = tuple[int, int, int, int, bool, bool]

# Sizes give odd grids (80x48 -> 5x3 = 15 image tokens, padded to 32); prompts below and above 32 tokens (the
# caption padding), padded and full text-encoder inputs, CFG on and off, batches.
FACTS: dict[str, list[dict[str, Any]]] = {
    "text_encoder": [dict(prompt_tokens=40), dict(prompt_tokens=64, text_padded=False, batch=2), dict()],
    "transformer": [
        dict(width=80, height=48, prompt_tokens=24),
        dict(width=64, height=64, prompt_tokens=100, batch=2),
        dict(width=64, height=96, prompt_tokens=300, guidance=False),
        dict(width=48, height=48, prompt_tokens=20, guidance=False, batch=2),
    ],
    "vae_decode": [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    "vae_encode": [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
}


@pytest.fixture(autouse=True)
def clean_attention() -> Iterator[None]:
    with pristine_attention():
        yield


def listed(memory: WorkingMemory) -> Counter[Key]:
    calls: Counter[Key] = Counter()
    for c in memory.attention_calls:
        calls[(c.num_heads, c.query_len, c.key_len, c.head_dim, c.has_attn_mask, c.is_causal)] += c.count
    return calls


@contextmanager
def recording() -> Iterator[Counter[Key]]:
    calls: Counter[Key] = Counter()
    real = F.scaled_dot_product_attention

    def recorder(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):  # type: ignore[no-untyped-def]
        heads = query.shape[0] * query.shape[1]
        calls[(heads, query.shape[-2], key.shape[-2], query.shape[-1], attn_mask is not None, bool(is_causal))] += 1
        return real(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = recorder
    try:
        with torch.inference_mode():
            yield calls
    finally:
        F.scaled_dot_product_attention = real


@pytest.fixture(scope="module")
def demo_models(demo_zimage: Path) -> dict[str, Any]:
    from invokeai.backend.models.loaders import load_component
    from invokeai.backend.models.probe import probe_model

    probe = probe_model(demo_zimage)
    return {operation: load_component(probe, FAMILY.component_of(operation)) for operation in FAMILY.operations}


def test_every_operation_has_an_estimator_a_run_and_facts_to_check() -> None:
    assert set(estimators.ESTIMATORS) == set(runs.RUNS) == set(FACTS) == set(FAMILY.operations)


@pytest.mark.parametrize(
    ("operation", "overrides"),
    [pytest.param(op, kw, id=f"{op}/{i}") for op, cases in FACTS.items() for i, kw in enumerate(cases)],
)
def test_listed_calls_are_the_calls_the_demo_model_makes(demo_models: dict, operation: str, overrides: dict) -> None:
    model = demo_models[operation]
    facts = CallFacts(CPU, torch.float32, **overrides)
    expected = listed(estimators.ESTIMATORS[operation](model.config, facts))
    with recording() as actual:
        runs.RUNS[operation](model, facts, torch.Generator().manual_seed(0))()
    assert actual == expected
    assert sum(actual.values()) > 0


def test_a_guided_generation_step_makes_the_listed_calls(zimage_pipe: Any) -> None:
    """The real thing: the chat-templated prompt padded to 512 (masked, K/V repeated to the 4 query heads) and one
    guided step whose positive caption pads past the empty negative's 32 tokens (masked CFG batch)."""
    prompt = "a photo of a red house under a blue sky (no. 12345, oil on canvas)"
    with recording() as text_calls:
        positive = generation.encode_prompt(zimage_pipe.text_encoder, zimage_pipe.tokenizer, prompt, "cpu")
    negative = generation.encode_prompt(zimage_pipe.text_encoder, zimage_pipe.tokenizer, "", "cpu")
    text = estimators.text_encoder(zimage_pipe.text_encoder.config, CallFacts(CPU, torch.float32))
    assert text_calls == listed(text)
    assert {key[4] for key in text_calls} == {True} and {key[0] for key in text_calls} == {4}
    with recording() as step_calls:
        generation.denoise(
            zimage_pipe.transformer,
            zimage_pipe.scheduler,
            prompt_embeds=positive,
            negative_embeds=negative,
            width=80,
            height=48,
            steps=1,
            seed=0,
            device="cpu",
            dtype=torch.float32,
            guidance_scale=3.0,
        )
    facts = CallFacts(CPU, torch.float32, width=80, height=48, prompt_tokens=len(positive))
    assert 32 < len(positive) and len(negative) <= 32
    assert step_calls == listed(estimators.transformer(zimage_pipe.transformer.config, facts))
    assert any(key[4] for key in step_calls)


def config_of(variant: str, operation: str) -> dict:
    return VARIANTS[variant].component_config(FAMILY.component_of(operation))


def test_turbo_at_1024_with_cfg_attends_over_image_and_caption_tokens() -> None:
    memory = estimators.transformer(config_of("z-image", "transformer"), CallFacts(CPU, torch.bfloat16, 1024, 1024))
    by_length = {call.query_len: call for call in memory.attention_calls}
    assert sorted(by_length) == [512, 4096, 4096 + 512]
    main = by_length[4096 + 512]
    assert (main.num_heads, main.head_dim, main.count, main.has_attn_mask) == (60, 128, 30, True)
    assert (by_length[4096].count, by_length[4096].has_attn_mask, by_length[512].count) == (2, False, 2)
    turbo = estimators.transformer(
        config_of("z-image", "transformer"), CallFacts(CPU, torch.bfloat16, 1024, 1024, guidance=False)
    )
    assert {call.num_heads for call in turbo.attention_calls} == {30}
    assert not any(call.has_attn_mask for call in turbo.attention_calls)
    # Under a math kernel (what an unprobeable device is priced as) the main call materialises 60 x 4608² scores.
    assert memory.score_matrix_bytes("cuda", torch.bfloat16) >= 60 * 4608**2 * 17


def test_the_4b_text_encoder_repeats_key_value_heads_when_masked() -> None:
    config = config_of("z-image", "text_encoder")
    (padded,) = estimators.text_encoder(config, CallFacts(CPU, torch.bfloat16)).attention_calls
    assert (padded.num_heads, padded.kv_heads, padded.query_len, padded.head_dim) == (32, None, 512, 128)
    assert padded.has_attn_mask and not padded.is_causal and padded.count == 36
    (full,) = estimators.text_encoder(config, CallFacts(CPU, torch.bfloat16, text_padded=False)).attention_calls
    assert (full.kv_heads, full.is_causal, full.has_attn_mask) == (8, True, False)


@pytest.mark.parametrize("operation", sorted(estimators.ESTIMATORS))
def test_activation_grows_with_batch_and_resolution(operation: str) -> None:
    config = config_of("z-image", operation)

    def at(size: int, batch: int = 1, **kwargs: Any) -> int:
        facts = CallFacts(torch.device("cuda"), torch.bfloat16, width=size, height=size, batch=batch, **kwargs)
        return estimators.ESTIMATORS[operation](config, facts).activation_bytes

    assert at(512, batch=2) > at(512)
    if operation != "text_encoder":
        assert at(1024) > 2 * at(512)
    if operation == "transformer":
        assert at(512) == 2 * at(512, guidance=False)


def _calibrate(*args: str) -> list[list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--full-size", FAMILY.name, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return [line.split() for line in result.stdout.splitlines()[2:]]


needs_proc: Callable[[Any], Any] = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/proc/self/clear_refs"),
    reason="the CPU peak is read from Linux's /proc",
)


@needs_proc
def test_estimates_bound_the_measured_peak_of_the_demo_architecture() -> None:
    """The demo architecture (the shipped zimage-demo config, random weights) at 64 and 128 px, batches raised
    until the estimate reaches 8 MiB, CFG on: each estimate is 1.0-1.3 times the measured peak."""
    rows = _calibrate("--variant", "zimage-demo", "--sizes", "64,128", "--repeats", "1")
    assert {row[1] for row in rows} == set(FAMILY.operations)
    for row in rows:
        estimate, measured = float(row[5]), float(row[6])
        assert measured > 1.0, row
        assert 1.0 <= estimate / measured <= 1.3, row
