"""The ROCm wide-head guard and chunked math, with the guard forced on for the CPU."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from invokeai.backend import devices
from invokeai.backend.attention import (
    attention_caller,
    attention_stats,
    install_attention,
    rocm_guard,
    serving_kernel,
)
from invokeai.backend.attention.memory import bytes_per_score_element
from invokeai.backend.attention.rocm_guard import (
    DEFAULT_MAX_HEAD_DIM,
    MAX_HEAD_DIM_ENV,
    chunked_math,
    max_fused_head_dim,
)


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
    "grouped-query heads, a budget below one group": dict(q_heads=8, kv_heads=2, heads=2, enable_gqa=True),
    "grouped-query rows": dict(q_heads=8, kv_heads=2, heads=0.4, enable_gqa=True),
    "one shared key-value head": dict(q_heads=4, kv_heads=1, heads=1),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "per-head additive", "3-D per-head additive"])
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
    if mask_kind == "3-D per-head additive":
        mask = torch.randn(case["q_heads"], 24, k.shape[2], generator=generator)
    gqa = case.get("enable_gqa", False)
    expected = _unchunked(q, k, v, mask, 0.0, causal, 0.25, gqa)
    got = chunked_math(q, k, v, mask, 0.0, causal, 0.25, gqa, budget=_budget_for(q, k, case["heads"]))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _record_pieces(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every math call chunked_math makes, as (query, key) of the piece."""
    pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = rocm_guard._math

    def spy(q, k, *args):  # type: ignore[no-untyped-def]
        pieces.append((q, k))
        return real(q, k, *args)

    monkeypatch.setattr(rocm_guard, "_math", spy)
    return pieces


def test_chunking_bounds_the_score_matrix_of_each_piece(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pieces = _record_pieces(monkeypatch)
    q = torch.randn(1, 4, 32, 8)
    budget = _budget_for(q, q, 0.5)
    chunked_math(q, q, q, None, 0.0, True, None, False, budget=budget)
    sizes = [
        p.shape[0] * p.shape[1] * p.shape[2] * k.shape[2] * bytes_per_score_element(p.device, p.dtype)
        for p, k in pieces
    ]
    assert len(sizes) > 4 and max(sizes) <= budget


# Query heads 16 in groups of 4 (4 key-value heads). Budgets in heads' worth of scores: whole multiples of a group,
# one group and a half, two and a half, exactly one, and below one group (query rows of a whole group).
GROUP_BUDGETS = [8, 6, 10, 4, 3, 2, 1, 0.5]


@pytest.mark.parametrize("heads", GROUP_BUDGETS)
@pytest.mark.parametrize("mask_kind", ["none", "causal", "per-head additive"])
def test_a_chunk_never_splits_a_grouped_query_group(monkeypatch, heads: float, mask_kind: str) -> None:  # type: ignore[no-untyped-def]
    q_heads, kv_heads, group = 16, 4, 4
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(2, q_heads, 24, 16, generator=generator)
    k = torch.randn(2, kv_heads, 24, 16, generator=generator)
    v = torch.randn_like(k)
    mask = torch.randn(2, q_heads, 24, 24, generator=generator) if mask_kind == "per-head additive" else None
    causal = mask_kind == "causal"
    # Where each (query head, row) and key-value head is: the pieces are located by their values, not by how they
    # were sliced.
    where_q = {tuple(q[0, h, r].tolist()): (h, r) for h in range(q_heads) for r in range(q.shape[2])}
    where_k = {tuple(k[0, h, 0].tolist()): h for h in range(kv_heads)}
    pieces = _record_pieces(monkeypatch)

    got = chunked_math(q, k, v, mask, 0.0, causal, None, True, budget=_budget_for(q, k, heads))

    assert len(pieces) > 1, "the budget must make it chunk"
    for piece_q, piece_k in pieces:
        located = [where_q[tuple(piece_q[0, j, 0].tolist())] for j in range(piece_q.shape[1])]
        covered, first_row = [h for h, _ in located], located[0][1]
        assert covered == list(range(covered[0], covered[0] + len(covered))), covered
        assert covered[0] % group == 0 and len(covered) % group == 0, f"a piece of heads {covered} splits a group"
        assert {r for _, r in located} == {first_row}
        assert [where_k[tuple(piece_k[0, j, 0].tolist())] for j in range(piece_k.shape[1])] == list(
            range(covered[0] // group, (covered[-1] // group) + 1)
        ), "each group must meet its own key-value head"
    reference = torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, mask, 0.0, causal, None, scale=None, enable_gqa=True
    )[0]
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bool], ids=["additive", "bool"])
@pytest.mark.parametrize("heads", [3, 0.25])
def test_a_mask_with_is_causal_raises_pytorchs_error_also_in_chunks(heads: float, mask_dtype: torch.dtype) -> None:
    q = torch.randn(1, 4, 24, 16)
    mask = torch.ones(1, 1, 24, 24).to(mask_dtype)
    with pytest.raises(RuntimeError) as expected:
        torch.ops.aten._scaled_dot_product_attention_math(q, q, q, mask, 0.0, True, None)
    with pytest.raises(RuntimeError) as from_sdpa:
        _unchunked(q, q, q, mask, is_causal=True)
    assert str(from_sdpa.value) == str(expected.value)
    with pytest.raises(type(expected.value)) as got:
        chunked_math(q, q, q, mask, 0.0, True, None, False, budget=_budget_for(q, q, heads))
    assert str(got.value) == str(expected.value)


@pytest.fixture
def rocm(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(devices, "is_rocm", lambda: True)


def test_a_guarded_call_with_a_mask_and_is_causal_raises_pytorchs_error(rocm, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(rocm_guard, "MATH_CHUNK_BYTES", 1024)  # rows of one head: the mask must not be dropped
    install_attention("auto")
    q = torch.randn(1, 2, 16, DEFAULT_MAX_HEAD_DIM + 256)
    mask = torch.zeros(1, 1, 16, 16)
    with pytest.raises(RuntimeError) as expected:
        _unchunked(q, q, q, mask, is_causal=True)
    with pytest.raises(RuntimeError) as got:
        F.scaled_dot_product_attention(q, q, q, mask, is_causal=True)
    assert str(got.value) == str(expected.value)


def test_a_head_wider_than_the_limit_runs_math_through_aten_without_touching_the_flags(rocm, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    q = torch.randn(1, 1, 16, DEFAULT_MAX_HEAD_DIM + 256)
    expected = _unchunked(q, q, q)
    orders_seen = []
    real = rocm_guard.chunked_math

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        orders_seen.append((torch._C._get_sdp_priority_order(), torch._C._get_flash_sdp_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(rocm_guard, "chunked_math", spy)
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
    assert (entry.serving, entry.reason) == ("MATH", "rocm_guard")
    assert "the ROCm wide-head guard sends calls with head_dim above 256 to math" in entry.message


def test_with_math_pinned_a_guarded_call_is_not_reported(rocm, stand_in_gpu, dispatcher) -> None:  # type: ignore[no-untyped-def]
    # The guard sends the call to math, and math is the pinned kernel: it served the call, nothing to report.
    dispatcher("FLASH_ATTENTION", "MATH")
    install_attention("math")
    assert "report" in attention_stats().layers
    wide = torch.randn(1, 1, 16, 512)
    with attention_caller("vae_decode"):
        F.scaled_dot_product_attention(wide, wide, wide)
    assert attention_stats().reports == []
    assert attention_stats().counts["vae_decode"] == {"MATH": 1}


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
    monkeypatch.setattr(rocm_guard, "MATH_CHUNK_BYTES", 4096)
    budgets = []
    real = rocm_guard.chunked_math
    monkeypatch.setattr(rocm_guard, "chunked_math", lambda *a, **kw: budgets.append(a[-1]) or real(*a, **kw))
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
