"""The grouped-query Krea-2 attention processor: same output as diffusers' stock processor, and K/V kept grouped or
expanded by the rule (expand when the expanded call gets a higher-ranked kernel; grouped only on a fused kernel).

PyTorch's CPU dispatcher ignores the kernel order, so the decisions are exercised with a stand-in dispatcher that
answers as CUDA's does: it walks PyTorch's real flags and priority order (as installed by the attention policy) and
returns the first enabled kernel that can serve the call, with separate capabilities for grouped calls
(enable_gqa with fewer K/V heads) and for expanded ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_krea2 import Krea2Attention, Krea2AttnProcessor
from torch.nn.attention import SDPBackend

from invokeai.backend import devices
from invokeai.backend.attention import install_attention, uninstall_attention
from invokeai.backend.attention.benchmarking import sdpa_window
from invokeai.backend.attention.policy import apply_flags, read_flags
from invokeai.backend.families.krea2.attention import (
    EXPANDED,
    GROUPED,
    Krea2GroupedQueryAttnProcessor,
    choose_layout,
    install_krea2_attention,
)

FLASH, CUDNN, EFFICIENT, MATH = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)
# What a recent NVIDIA GPU offers for Krea-2's masked calls: flash refuses masks, the memory-efficient kernel refuses
# enable_gqa, cuDNN and math take both layouts.
MASKED_GPU = ({"CUDNN_ATTENTION", "MATH"}, {"CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"})
# A device without cuDNN attention (ROCm, some older cards): only math takes the grouped call.
NO_CUDNN = ({"MATH"}, {"EFFICIENT_ATTENTION", "MATH"})
# Unmasked calls where flash takes grouped heads.
FLASH_GQA = ({"FLASH_ATTENTION", "MATH"}, {"FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"})


@pytest.fixture(autouse=True)
def clean_attention(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("INVOKE_KREA2_SDPA_BACKEND", raising=False)
    original, flags = F.scaled_dot_product_attention, read_flags()
    torch.set_num_threads(1)
    yield
    uninstall_attention()
    F.scaled_dot_product_attention = original
    apply_flags(flags)


class GqaAwareDispatcher:
    """`torch._fused_sdp_choice` as CUDA answers it, with the kernels that can serve grouped and expanded calls."""

    def __init__(self, grouped: set[str], expanded: set[str]) -> None:
        self.grouped, self.expanded = grouped, expanded

    def __call__(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
    ) -> int:  # type: ignore[no-untyped-def]
        can_serve = self.grouped if enable_gqa and key.shape[1] != query.shape[1] else self.expanded
        flags = read_flags()
        for value_ in flags.order:
            if SDPBackend(value_) in flags.enabled and SDPBackend(value_).name in can_serve:
                return value_
        return int(SDPBackend.ERROR)


class SdpaSpy:
    """Stands in for PyTorch's SDPA under the policy: records each call's K/V layout and computes it with plain
    tensor ops, so a window enabling a kernel the CPU lacks still runs."""

    def __init__(self) -> None:
        self.layouts: list[str] = []

    def __call__(self, query, key, value, attn_mask=None, *args, **kwargs):  # type: ignore[no-untyped-def]
        groups = query.shape[1] // key.shape[1]
        self.layouts.append(GROUPED if groups > 1 else EXPANDED)
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        scores = query @ key.transpose(-2, -1) / query.shape[-1] ** 0.5
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        return scores.softmax(dim=-1) @ value


@pytest.fixture
def gpu_like(monkeypatch: pytest.MonkeyPatch) -> Callable[..., SdpaSpy]:
    """Install `setting` with a stand-in dispatcher for `capabilities`; returns the spy on the real SDPA calls."""

    def install(setting: str, capabilities: tuple[set[str], set[str]]) -> SdpaSpy:
        monkeypatch.setattr(devices, "fused_sdp_choice", GqaAwareDispatcher(*capabilities))
        spy = SdpaSpy()
        monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
        install_attention(setting)
        return spy

    return install


def _attention(seed: int = 0) -> Krea2Attention:
    torch.manual_seed(seed)
    module = Krea2Attention(hidden_size=64, num_heads=4, num_kv_heads=2).eval()
    with torch.no_grad():
        module.norm_q.weight.normal_(0, 0.1)
        module.norm_k.weight.normal_(0, 0.1)
    return module


def _inputs(masked: bool = True, tokens: int = 24) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, tokens, 64, generator=generator)
    mask = None
    if masked:
        mask = torch.ones(2, 1, 1, tokens, dtype=torch.bool)
        mask[0, ..., tokens - 5 :] = False
    cos, sin = torch.randn(tokens, 16, generator=generator), torch.randn(tokens, 16, generator=generator)
    return {"hidden_states": hidden, "attention_mask": mask, "image_rotary_emb": (cos, sin)}


@torch.no_grad()
def _run(module: Krea2Attention, processor: Any, inputs: dict[str, Any]) -> torch.Tensor:
    module.set_processor(processor)
    return module(**inputs)


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        # (grouped kernel, expanded kernel, order) -> layout
        ((CUDNN, CUDNN, [FLASH, CUDNN, EFFICIENT, MATH]), GROUPED),  # same kernel, fused: no copy
        ((CUDNN, EFFICIENT, [EFFICIENT, FLASH, CUDNN, MATH]), EXPANDED),  # pinned efficient serves only expanded
        ((CUDNN, EFFICIENT, [FLASH, CUDNN, EFFICIENT, MATH]), GROUPED),  # expanded would get a lower-ranked kernel
        ((MATH, MATH, [MATH, FLASH, CUDNN, EFFICIENT]), EXPANDED),  # grouped only on a fused kernel
        ((MATH, EFFICIENT, [FLASH, CUDNN, EFFICIENT, MATH]), EXPANDED),
        ((SDPBackend.ERROR, EFFICIENT, [EFFICIENT]), EXPANDED),  # an exclusive window the grouped call cannot use
        ((SDPBackend.ERROR, SDPBackend.ERROR, [FLASH]), EXPANDED),  # the call fails either way, as stock
        (("sage", CUDNN, [FLASH, CUDNN, EFFICIENT, MATH]), GROUPED),
    ],
)
def test_the_decision_rule(table: tuple[Any, Any, list[SDPBackend]], expected: str) -> None:
    grouped, expanded, order = table
    assert choose_layout(grouped, expanded, [int(kernel) for kernel in order]) == expected


@pytest.mark.parametrize(
    ("setting", "capabilities", "expected"),
    [
        ("auto", MASKED_GPU, GROUPED),  # both on cuDNN
        ("cudnn", MASKED_GPU, GROUPED),
        ("flash", MASKED_GPU, GROUPED),  # flash refuses the mask: both on cuDNN
        ("efficient", MASKED_GPU, EXPANDED),  # a pinned efficient really runs on memory-efficient attention
        ("math", MASKED_GPU, EXPANDED),  # both on math: math would expand again internally
        ("auto", NO_CUDNN, EXPANDED),  # grouped would fall to math, expanded gets memory-efficient
        ("auto", FLASH_GQA, GROUPED),
        ("efficient", FLASH_GQA, EXPANDED),
    ],
)
def test_grouped_or_expanded_under_each_setting(
    gpu_like: Callable[..., SdpaSpy], setting: str, capabilities: tuple[set[str], set[str]], expected: str
) -> None:
    spy = gpu_like(setting, capabilities)
    module, inputs = _attention(), _inputs(masked=capabilities is not FLASH_GQA)
    stock = _run(module, Krea2AttnProcessor(), inputs)
    ours = Krea2GroupedQueryAttnProcessor()
    out = _run(module, ours, inputs)
    assert spy.layouts == [EXPANDED, expected]
    assert list(ours.policy.decisions.values()) == [expected]
    torch.testing.assert_close(out, stock, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("window", "expected"), [("efficient", EXPANDED), ("priority-cudnn", GROUPED)])
def test_a_window_changes_the_decision_and_closing_it_restores_it(
    gpu_like: Callable[..., SdpaSpy], window: str, expected: str
) -> None:
    spy = gpu_like("efficient" if window == "priority-cudnn" else "auto", MASKED_GPU)
    module, inputs, processor = _attention(), _inputs(), Krea2GroupedQueryAttnProcessor()
    outside = _run(module, processor, inputs)
    with sdpa_window(window):
        inside = _run(module, processor, inputs)
    _run(module, processor, inputs)
    outside_layout = GROUPED if window == "efficient" else EXPANDED
    assert spy.layouts == [outside_layout, expected, outside_layout]
    assert processor.policy.asked == 3  # the state changed twice, so the question was asked again each time
    torch.testing.assert_close(inside, outside, rtol=1e-5, atol=1e-6)


def test_the_decision_is_asked_once_per_shape_and_state(gpu_like: Callable[..., SdpaSpy]) -> None:
    gpu_like("efficient", MASKED_GPU)
    module, processor = _attention(), Krea2GroupedQueryAttnProcessor()
    for _ in range(3):
        _run(module, processor, _inputs())
    assert processor.policy.asked == 1
    _run(module, processor, _inputs(tokens=40))  # a new shape
    _run(module, processor, _inputs(masked=False))  # no mask is a different call
    assert processor.policy.asked == 3
    install_attention("auto")  # a new policy: new flags and a new SDPA function
    _run(module, processor, _inputs())
    assert processor.policy.asked == 4


def test_other_diffusers_backends_get_the_stock_expanded_heads(gpu_like: Callable[..., SdpaSpy]) -> None:
    spy = gpu_like("auto", MASKED_GPU)
    module, inputs = _attention(), _inputs()
    processor = Krea2GroupedQueryAttnProcessor()
    processor._attention_backend = "_native_math"
    stock = Krea2AttnProcessor()
    stock._attention_backend = "_native_math"
    torch.testing.assert_close(_run(module, processor, inputs), _run(module, stock, inputs), rtol=1e-5, atol=1e-6)
    assert processor.policy.asked == 0 and set(spy.layouts) == {EXPANDED}


@torch.no_grad()
def test_a_whole_transformer_gives_the_stock_output() -> None:
    from invokeai.backend.families.krea2.demo import build_krea2_transformer

    stock, ours = build_krea2_transformer(), build_krea2_transformer()
    policy = install_krea2_attention(ours)
    assert install_krea2_attention(ours) is policy  # idempotent
    processors = [m.processor for m in ours.modules() if isinstance(m, Krea2Attention)]
    assert len(processors) == 6 and all(isinstance(p, Krea2GroupedQueryAttnProcessor) for p in processors)
    assert all(p.policy is policy for p in processors)

    generator = torch.Generator().manual_seed(0)
    text, image = 10, 16
    mask = torch.ones(1, text, dtype=torch.bool)
    mask[:, 6:] = False
    positions = torch.zeros(text + image, 3)
    positions[text:, 1:] = torch.cartesian_prod(torch.arange(4.0), torch.arange(4.0))
    kwargs = dict(
        hidden_states=torch.randn(1, image, 64, generator=generator),
        encoder_hidden_states=torch.randn(1, text, 3, 32, generator=generator),
        timestep=torch.tensor([0.7]),
        position_ids=positions,
        encoder_attention_mask=mask,
    )
    torch.testing.assert_close(ours(**kwargs).sample, stock(**kwargs).sample, rtol=1e-5, atol=1e-6)
    # On this CPU flash serves grouped and expanded calls alike, so every grouped-query call kept its heads grouped.
    assert set(policy.decisions.values()) == {GROUPED}
