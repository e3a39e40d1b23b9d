"""The ROCm wide-head guard and chunked math, with the guard forced on for the CPU."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from invokeai.backend.attention import (
    attention_caller,
    attention_stats,
    devices,
    install,
    install_attention,
    patch,
    serving_kernel,
)
from invokeai.backend.attention.rocm_guard import (
    DEFAULT_MAX_HEAD_DIM,
    MAX_HEAD_DIM_ENV,
    chunked_math,
    max_fused_head_dim,
)
from invokeai.backend.attention.memory import bytes_per_score_element


def _unchunked(q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):  # type: ignore[no-untyped-def]
    """PyTorch's own SDPA on its math kernel: the semantics the guard must keep."""
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _budget_for(q: torch.Tensor, k: torch.Tensor, heads: float) -> int:
    """A budget that fits `heads` heads' score matrices (fractions force query-row chunks)."""
    return int(q.shape[0] * q.shape[2] * k.shape[2] * bytes_per_score_element(q.device, q.dtype) * heads)


CASES = {
    "head groups": dict(q_heads=8, kv_heads=8, heads=3),
    "query rows": dict(q_heads=4, kv_heads=4, heads=0.3),
    "grouped-query heads, whole groups": dict(q_heads=8, kv_heads=2, heads=4, enable_gqa=True),
    "grouped-query heads, split groups": dict(q_heads=8, kv_heads=2, heads=2, enable_gqa=True),
    "grouped-query rows": dict(q_heads=8, kv_heads=2, heads=0.4, enable_gqa=True),
    "one shared key-value head": dict(q_heads=4, kv_heads=1, heads=1),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "per-head additive"])
def test_chunked_math_equals_the_unchunked_call(name: str, mask_kind: str) -> None:
    case = CASES[name]
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(2, case["q_heads"], 24, 16, generator=generator)
    k = torch.randn(2, case["kv_heads"], 20 if mask_kind != "causal" else 24, 16, generator=generator)
    v = torch.randn_like(k)
    mask, causal = None, mask_kind == "causal"
    if mask_kind == "padding":
        mask = torch.ones(2, 1, 1, k.shape[2], dtype=torch.bool)
        mask[..., -5:] = False
    if mask_kind == "per-head additive":
        mask = torch.randn(2, case["q_heads"], 24, k.shape[2], generator=generator)
    gqa = case.get("enable_gqa", False)
    expected = _unchunked(q, k, v, mask, 0.0, causal, 0.25, gqa)
    got = chunked_math(q, k, v, mask, 0.0, causal, 0.25, gqa, budget=_budget_for(q, k, case["heads"]))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_chunking_bounds_the_score_matrix_of_each_piece(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pieces = []
    real = patch.chunked_math.__globals__["_math"]

    def spy(q, k, *args):  # type: ignore[no-untyped-def]
        pieces.append(q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * bytes_per_score_element(q.device, q.dtype))
        return real(q, k, *args)

    monkeypatch.setitem(patch.chunked_math.__globals__, "_math", spy)
    q = torch.randn(1, 4, 32, 8)
    budget = _budget_for(q, q, 0.5)
    chunked_math(q, q, q, None, 0.0, True, None, False, budget=budget)
    assert len(pieces) > 4 and max(pieces) <= budget


@pytest.fixture
def rocm(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(devices, "is_rocm", lambda: True)


def test_a_head_wider_than_the_limit_runs_math_through_aten_without_touching_the_flags(rocm, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    q = torch.randn(1, 1, 16, DEFAULT_MAX_HEAD_DIM + 256)
    expected = _unchunked(q, q, q)
    orders_seen = []
    real = patch.chunked_math

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        orders_seen.append((torch._C._get_sdp_priority_order(), torch._C._get_flash_sdp_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(patch, "chunked_math", spy)
    install_attention("auto")
    installed = (torch._C._get_sdp_priority_order(), torch._C._get_flash_sdp_enabled())
    with attention_caller("vae_decode"):
        out = F.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(out, expected)
    assert orders_seen == [installed]
    assert serving_kernel(q, q, q).name == "MATH"
    assert attention_stats().counts["vae_decode"] == {"MATH": 1}
    narrow = torch.randn(1, 1, 16, 64)
    F.scaled_dot_product_attention(narrow, narrow, narrow)
    assert attention_stats().counts["(no node)"] == {"FLASH_ATTENTION": 1}


def test_the_guard_is_reported_when_a_kernel_is_pinned(rocm, stand_in_gpu, dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    install_attention("efficient")
    q = torch.randn(1, 1, 16, 512)
    with attention_caller("vae_decode"):
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q)
    (entry,) = attention_stats().reports
    assert (entry["serving"], entry["reason"]) == ("MATH", "rocm_guard")
    assert "the ROCm wide-head guard sent this call (head_dim 512 > 256) to math" in entry["message"]


def test_the_head_limit_comes_from_the_environment(rocm, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(MAX_HEAD_DIM_ENV, "64")
    install_attention("auto")
    q = torch.randn(1, 2, 16, 128)
    assert serving_kernel(q, q, q).name == "MATH"
    assert serving_kernel(q[..., :64], q[..., :64], q[..., :64]).name == "FLASH_ATTENTION"


@pytest.mark.parametrize("raw", ["wide", "0", "-3", "12.5"])
def test_a_bad_head_limit_warns_and_uses_the_default(raw: str, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(MAX_HEAD_DIM_ENV, raw)
    caplog.set_level(logging.WARNING)
    assert max_fused_head_dim() == DEFAULT_MAX_HEAD_DIM
    assert any(MAX_HEAD_DIM_ENV in r.getMessage() for r in caplog.records)


def test_a_big_math_call_runs_in_chunks(rocm, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(install, "MATH_CHUNK_BYTES", 4096)
    budgets = []
    real = patch.chunked_math
    monkeypatch.setattr(patch, "chunked_math", lambda *a, **kw: budgets.append(a[-1]) or real(*a, **kw))
    install_attention("auto")
    q = torch.randn(1, 2, 32, 8)
    F.scaled_dot_product_attention(q, q, q)
    assert budgets == []  # flash serves it: nothing to chunk
    out = F.scaled_dot_product_attention(q, q, q, dropout_p=1e-9)  # CPU flash refuses dropout: math serves it
    assert budgets == [4096]
    assert out.shape == q.shape


def test_the_guard_is_absent_off_rocm() -> None:
    install_attention("auto")
    q = torch.randn(1, 1, 16, 512)
    assert serving_kernel(q, q, q).name == "FLASH_ATTENTION"
