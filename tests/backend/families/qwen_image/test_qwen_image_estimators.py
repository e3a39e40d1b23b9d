"""Qwen-Image's working-memory estimators: the attention calls each lists are the SDPA calls the real demo component
makes (in its calibration run, and in the nodes' own calls: one prompt's causal grouped-query text encoder, the
guided transformer's two unmasked calls a step), and the full-size numbers come out as the architecture says. How
the estimates compare with the measured peaks is checked by tests/backend/cache/test_cache_calibration.py (every
family's demo) and recorded in the estimators module."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from invokeai.backend.attention.testing import pristine_attention
from invokeai.backend.cache.estimate import CallFacts, WorkingMemory
from invokeai.backend.families.qwen_image import estimators, generation, runs
from invokeai.backend.families.qwen_image.descriptor import CONFIG_VARIANTS, FAMILY

CPU = torch.device("cpu")
VARIANTS = {variant.name: variant for variant in CONFIG_VARIANTS}
# (heads incl. batch, query length, key length, head dim, masked, causal, grouped key-value heads)
Key = tuple[int, int, int, int, bool, bool, int | None]

# Odd grids (80x48 -> 5x3 tokens), padded batches and single prompts, batches.
FACTS: dict[str, list[dict[str, Any]]] = {
    "text_encoder": [
        dict(prompt_tokens=50, text_padded=False),
        dict(prompt_tokens=70, batch=2),
        dict(prompt_tokens=40, batch=3, text_padded=False),
    ],
    "transformer": [
        dict(width=80, height=48, prompt_tokens=20, text_padded=False),
        dict(width=64, height=64, prompt_tokens=30, batch=2),
        dict(width=48, height=96, prompt_tokens=9, text_padded=False, guidance=False),
    ],
    "vae_decode": [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
    "vae_encode": [dict(width=72, height=56), dict(width=64, height=64, batch=2)],
}


@pytest.fixture(autouse=True)
def clean_attention() -> Iterator[None]:
    with pristine_attention():
        yield


def listed(memory: WorkingMemory, repeat: int = 1) -> Counter[Key]:
    calls: Counter[Key] = Counter()
    for c in memory.attention_calls:
        key = (c.num_heads, c.query_len, c.key_len, c.head_dim, c.has_attn_mask, c.is_causal, c.kv_heads)
        calls[key] += c.count * repeat
    return calls


@contextmanager
def recording() -> Iterator[Counter[Key]]:
    calls: Counter[Key] = Counter()
    real = F.scaled_dot_product_attention

    def recorder(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):  # type: ignore[no-untyped-def]
        heads = query.shape[0] * query.shape[1]
        grouped = key.shape[0] * key.shape[1] if key.shape[1] != query.shape[1] else None
        shape = (heads, query.shape[-2], key.shape[-2], query.shape[-1])
        calls[(*shape, attn_mask is not None, bool(is_causal), grouped)] += 1
        return real(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = recorder
    try:
        with torch.inference_mode():
            yield calls
    finally:
        F.scaled_dot_product_attention = real


@pytest.fixture(scope="module")
def demo_models(demo_qwen_image: Path) -> dict[str, Any]:
    from invokeai.backend.models.loaders import load_component
    from invokeai.backend.models.probe import probe_model

    probe = probe_model(demo_qwen_image)
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


def test_the_nodes_calls_are_the_listed_ones(qwen_pipe: Any) -> None:
    """The real thing, as the nodes call it: one prompt through the text encoder (causal, the 2 key-value heads of
    4 passed grouped, no mask) and a guided step (the positive and the negative as two unmasked calls a block)."""
    prompt = "a photo of a red house under a blue sky"
    ids, _ = generation.tokenize(qwen_pipe.tokenizer, [prompt], "cpu")
    with recording() as text_calls:
        positive, _ = generation.encode_prompt(qwen_pipe.text_encoder, qwen_pipe.tokenizer, prompt, "cpu")
    facts = CallFacts(CPU, torch.float32, prompt_tokens=ids.shape[1], text_padded=False)
    assert text_calls == listed(estimators.text_encoder(qwen_pipe.text_encoder.config, facts))
    assert {key[6] for key in text_calls} == {2} and {key[5] for key in text_calls} == {True}
    negative, _ = generation.encode_prompt(qwen_pipe.text_encoder, qwen_pipe.tokenizer, " ", "cpu")
    with recording() as step_calls:
        generation.denoise(
            qwen_pipe.transformer,
            qwen_pipe.scheduler,
            prompt_embeds=positive,
            negative_embeds=negative,
            width=80,
            height=48,
            steps=2,
            seed=0,
            device="cpu",
            dtype=torch.float32,
        )
    expected: Counter[Key] = Counter()
    for tokens in (positive.shape[1], negative.shape[1]):
        step = CallFacts(CPU, torch.float32, width=80, height=48, prompt_tokens=tokens, text_padded=False)
        expected += listed(estimators.transformer(qwen_pipe.transformer.config, step), repeat=2)
    assert step_calls == expected and not any(key[4] for key in step_calls)
    # The node prices the longer of the two: every call it makes is at most that long.
    longest = max(positive.shape[1], negative.shape[1])
    priced = CallFacts(CPU, torch.float32, width=80, height=48, prompt_tokens=longest, text_padded=False)
    (call,) = estimators.transformer(qwen_pipe.transformer.config, priced).attention_calls
    assert max(key[1] for key in step_calls) == call.query_len


def config_of(variant: str, operation: str) -> dict:
    return VARIANTS[variant].component_config(FAMILY.component_of(operation))


def test_the_full_size_transformer_attends_jointly_over_text_and_image_tokens() -> None:
    facts = CallFacts(CPU, torch.bfloat16, 1328, 1328, prompt_tokens=200, text_padded=False)
    (call,) = estimators.transformer(config_of("qwen-image", "transformer"), facts).attention_calls
    assert (call.num_heads, call.head_dim, call.count, call.has_attn_mask) == (24, 128, 60, False)
    assert call.query_len == call.key_len == 200 + 83 * 83
    padded = CallFacts(CPU, torch.bfloat16, 1328, 1328, prompt_tokens=200, batch=2)
    (masked,) = estimators.transformer(config_of("qwen-image", "transformer"), padded).attention_calls
    assert masked.has_attn_mask and masked.num_heads == 48
    # Under a math kernel (what an unprobeable device is priced as) each call materialises 24 x 7089² scores.
    memory = estimators.transformer(config_of("qwen-image", "transformer"), facts)
    assert memory.score_matrix_bytes("cuda", torch.bfloat16) >= 24 * (200 + 83 * 83) ** 2 * 17


def test_the_7b_text_encoder_passes_grouped_heads_unless_padded() -> None:
    config = config_of("qwen-image", "text_encoder")
    one = CallFacts(CPU, torch.bfloat16, prompt_tokens=80, text_padded=False)
    (full,) = estimators.text_encoder(config, one).attention_calls
    assert (full.num_heads, full.kv_heads, full.query_len, full.head_dim) == (28, 4, 80, 128)
    assert full.is_causal and not full.has_attn_mask and full.count == 28
    batch = CallFacts(CPU, torch.bfloat16, prompt_tokens=80, batch=2)
    (padded,) = estimators.text_encoder(config, batch).attention_calls
    assert (padded.num_heads, padded.kv_heads, padded.has_attn_mask, padded.is_causal) == (56, None, True, False)


@pytest.mark.parametrize("operation", sorted(estimators.ESTIMATORS))
def test_activation_grows_with_batch_and_resolution(operation: str) -> None:
    config = config_of("qwen-image", operation)

    def at(size: int, batch: int = 1, **kwargs: Any) -> int:
        facts = CallFacts(torch.device("cuda"), torch.bfloat16, width=size, height=size, batch=batch, **kwargs)
        return estimators.ESTIMATORS[operation](config, facts).activation_bytes

    assert at(512, batch=2) > at(512)
    if operation == "text_encoder":
        assert at(512, prompt_tokens=600) > 2 * at(512, prompt_tokens=200)
    else:
        assert at(1024) > 2 * at(512)


def test_each_call_is_priced_on_the_kernel_the_dispatcher_will_choose(dispatcher: Any) -> None:
    """On a device where only math takes a mask (the flash kernel serves unmasked and grouped calls alone), the
    padded text encoder and the padded batch's transformer reserve math's score matrices, one prompt none."""
    from invokeai.backend.attention import install_attention

    dispatcher({"FLASH_ATTENTION": lambda call: call.attn_mask is None, "MATH": lambda call: True})
    install_attention("auto")
    text, transformer = config_of("qwen-image", "text_encoder"), config_of("qwen-image", "transformer")
    one = CallFacts(CPU, torch.bfloat16, prompt_tokens=300, text_padded=False)
    padded = CallFacts(CPU, torch.bfloat16, prompt_tokens=300, batch=2)
    for estimate, config in ((estimators.text_encoder, text), (estimators.transformer, transformer)):
        assert estimate(config, one).score_matrix_bytes(CPU, torch.bfloat16) == 0
        masked = estimate(config, padded)
        assert masked.score_matrix_bytes(CPU, torch.bfloat16) > 0
        assert masked.total(CPU, torch.bfloat16) > masked.activation_bytes
