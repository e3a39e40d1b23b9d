"""FLUX.1's working-memory estimators price the reviewer's case: FLUX.1 at 1024² under a pinned `math` backend needs
about 8.1 GiB per joint attention call (24 heads x 4608² x 17 bytes on CUDA). That each listed call is a call the
real demo component makes is tests/backend/cache/test_cache_attention_calls, for every family."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from invokeai.backend.attention import install_attention
from invokeai.backend.attention.testing import pristine_attention
from invokeai.backend.cache.estimate import CallFacts
from invokeai.backend.families.flux import estimators
from invokeai.backend.families.flux.descriptor import CONFIG_VARIANTS, FAMILY

CPU = torch.device("cpu")
VARIANTS = {variant.name: variant for variant in CONFIG_VARIANTS}


@pytest.fixture(autouse=True)
def clean_attention() -> Iterator[None]:
    with pristine_attention():
        yield


def config_of(variant: str, operation: str) -> dict:
    return VARIANTS[variant].component_config(FAMILY.component_of(operation))


def test_flux_dev_at_1024_attends_jointly_over_text_and_image_tokens() -> None:
    memory = estimators.transformer(config_of("flux", "transformer"), CallFacts(CPU, torch.bfloat16, 1024, 1024))
    (call,) = memory.attention_calls
    assert (call.num_heads, call.query_len, call.key_len, call.head_dim) == (24, 4096 + 512, 4608, 128)
    assert call.count == 19 + 38
    schnell = estimators.transformer(
        config_of("flux-schnell", "transformer"), CallFacts(CPU, torch.bfloat16, 1024, 1024, prompt_tokens=256)
    )
    assert schnell.attention_calls[0].query_len == 4096 + 256


def test_the_reviewers_case_math_materialises_about_8_gib_per_call_on_cuda() -> None:
    """24 heads x 4608² x 17 bytes (bf16 scores, their fp32 softmax and the mask) is 8.1 GiB per call on CUDA,
    plus math's copies of its operands (a few MiB). No CUDA device here: the pricing of a call the dispatcher
    cannot probe is math's, the conservative answer, which is what a pinned `math` reserves there."""
    memory = estimators.transformer(config_of("flux", "transformer"), CallFacts(CPU, torch.bfloat16, 1024, 1024))
    scores = 24 * 4608**2 * 17
    assert 8.0 * 2**30 < scores < 8.2 * 2**30
    priced = memory.score_matrix_bytes("cuda", torch.bfloat16)
    assert scores <= priced < scores * 1.05


def test_pinning_math_adds_the_largest_score_matrix_and_a_fused_kernel_nothing(
    dispatcher: Callable[..., Any],
) -> None:
    """With a dispatcher that serves every kernel: `auto` runs the joint call fused (nothing reserved for scores), a
    pinned `math` materialises it, and the reservation grows by exactly that call's matrix."""
    from invokeai.backend.attention.memory import PricedCall

    facts = CallFacts(CPU, torch.bfloat16, 1024, 1024)
    config = config_of("flux", "transformer")
    dispatcher("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    install_attention("auto", CPU)
    fused = estimators.transformer(config, facts)
    assert fused.total(CPU, torch.bfloat16) == fused.activation_bytes
    install_attention("math", CPU)
    pinned = estimators.transformer(config, facts)
    (call,) = pinned.attention_calls
    math_bytes = PricedCall(
        device=CPU,
        dtype=torch.bfloat16,
        num_heads=call.num_heads,
        kv_heads=call.num_heads,
        query_len=call.query_len,
        key_len=call.key_len,
        head_dim=call.head_dim,
        has_attn_mask=False,
        is_causal=False,
    ).math_bytes()
    assert pinned.total(CPU, torch.bfloat16) - pinned.activation_bytes == math_bytes > 24 * 4608**2 * 2


@pytest.mark.parametrize("operation", sorted(estimators.ESTIMATORS))
def test_activation_grows_with_batch_and_resolution(operation: str) -> None:
    config = config_of("flux", operation)

    def at(size: int, batch: int = 1) -> int:
        facts = CallFacts(torch.device("cuda"), torch.bfloat16, width=size, height=size, batch=batch)
        return estimators.ESTIMATORS[operation](config, facts).activation_bytes

    assert at(512, batch=2) > at(512)
    if not operation.startswith("text_encoder"):
        assert at(1024) > 2 * at(512)


def test_the_t5_estimate_follows_the_sequence_length() -> None:
    config = config_of("flux", "text_encoder_2")
    dev = estimators.text_encoder_2(config, CallFacts(CPU, torch.bfloat16, prompt_tokens=512))
    schnell = estimators.text_encoder_2(config, CallFacts(CPU, torch.bfloat16, prompt_tokens=256))
    assert dev.activation_bytes > 2 * schnell.activation_bytes
    assert (dev.attention_calls[0].query_len, dev.attention_calls[0].num_heads) == (512, 64)


def test_demo_models_and_tiny_configs_exist(demo_flux: Path) -> None:
    assert (demo_flux / "transformer" / "config.json").exists()
