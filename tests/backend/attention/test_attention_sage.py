"""attention_backend: sage, with a stand-in sageattention module on the CPU standing in for CUDA."""

from __future__ import annotations

import functools
import logging
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from invokeai.backend.attention import (
    attention_caller,
    attention_stats,
    install_attention,
    sdpa_score_matrix_bytes,
    serving_kernel,
    uninstall_attention,
)
from invokeai.backend.attention.memory import PricedCall
from invokeai.backend.attention.policy import read_flags
from invokeai.backend.attention.sage import SAGE_MIN_QUERY_LEN
from invokeai.backend.attention.testing import DispatchedCall


def _fake_sage_module(version: str, calls: list[dict]) -> types.ModuleType:
    """Behaves like sageattention 1.0.6: **kwargs swallows anything, smooth_k edits the key in place."""

    def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(
            {
                "tensor_layout": tensor_layout,
                "is_causal": is_causal,
                "sm_scale": sm_scale,
                "smooth_k": smooth_k,
                "kwargs": kwargs,
            }
        )
        if smooth_k:
            k -= k.mean(dim=-2, keepdim=True)
        if q.shape[1] != k.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return torch.ops.aten._scaled_dot_product_attention_math(
            q.float(), k.float(), v.float(), None, 0.0, is_causal, scale=sm_scale
        )[0].to(q.dtype)

    module = types.ModuleType("sageattention")
    module.sageattn = sageattn  # type: ignore[attr-defined]
    module.__version__ = version  # type: ignore[attr-defined]
    return module


@pytest.fixture
def sage_calls(stand_in_gpu, monkeypatch) -> list[dict]:  # type: ignore[no-untyped-def]
    calls: list[dict] = []
    monkeypatch.setitem(sys.modules, "sageattention", _fake_sage_module("1.0.6", calls))
    return calls


def _long_call(heads: int = 2, kv_heads: int = 2, head_dim: int = 64, length: int = SAGE_MIN_QUERY_LEN):  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(1, heads, length, head_dim, generator=generator).to(torch.bfloat16)
    k = (torch.randn(1, kv_heads, length, head_dim, generator=generator) + 3.0).to(torch.bfloat16)
    v = torch.randn(1, kv_heads, length, head_dim, generator=generator).to(torch.bfloat16)
    return q, k, v


def test_sage_serves_an_eligible_call_and_is_counted_as_sage(sage_calls) -> None:  # type: ignore[no-untyped-def]
    install_attention("sage")
    q, k, v = _long_call()
    key_before = k.clone()
    with attention_caller("krea2_denoise"):
        out = F.scaled_dot_product_attention(q, k, v, scale=0.2)
        assert serving_kernel(q, k, v, scale=0.2) == "sage"
    torch.testing.assert_close(
        out.float(), F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.2), atol=2e-2, rtol=2e-2
    )
    assert torch.equal(k, key_before), "the caller's key must never be modified"
    assert sage_calls == [
        {"tensor_layout": "HND", "is_causal": False, "sm_scale": 0.2, "smooth_k": False, "kwargs": {}}
    ]
    assert attention_stats().counts["krea2_denoise"] == {"sage": 1}
    assert attention_stats().sage == "1.0.6"


@pytest.mark.parametrize(
    "case",
    ["mask", "dropout", "head_dim 32", "float32", "short query", "grouped heads on 1.x", "causal with unequal lengths"],
)
def test_calls_sage_cannot_take_run_on_autos_order(sage_calls, case: str) -> None:  # type: ignore[no-untyped-def]
    install_attention("sage")
    q, k, v = _long_call(head_dim=32 if case == "head_dim 32" else 64, kv_heads=1 if "grouped" in case else 2)
    kwargs: dict = {}
    if case == "mask":
        kwargs["attn_mask"] = torch.zeros(1, 1, q.shape[2], k.shape[2], dtype=torch.bfloat16)
    if case == "dropout":
        kwargs["dropout_p"] = 0.1
    if case == "float32":
        q, k, v = q.float(), k.float(), v.float()
    if case == "short query":
        q = q[:, :, : SAGE_MIN_QUERY_LEN - 1]
    if "grouped" in case:
        kwargs["enable_gqa"] = True
    if case == "causal with unequal lengths":
        k, v = torch.cat([k, k[:, :, :8]], dim=2), torch.cat([v, v[:, :, :8]], dim=2)
        kwargs["is_causal"] = True
    F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert sage_calls == []
    assert "sage" not in attention_stats().counts["(no node)"]


def test_grouped_query_heads_go_to_a_sage_that_supports_them(stand_in_gpu, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[dict] = []
    monkeypatch.setitem(sys.modules, "sageattention", _fake_sage_module("2.2.0", calls))
    install_attention("sage")
    q, k, v = _long_call(heads=4, kv_heads=2)
    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert len(calls) == 1
    F.scaled_dot_product_attention(q, torch.cat([k, k], 1), torch.cat([v, v], 1))  # equal heads, no flag: fine too
    q_only, k_only, v_only = _long_call(heads=4, kv_heads=2)
    with pytest.raises(RuntimeError):  # without enable_gqa PyTorch refuses unequal heads, and so must we
        F.scaled_dot_product_attention(q_only, k_only, v_only)
    assert len(calls) == 2


def test_sage_not_importable_warns_and_uses_autos_order(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "sageattention", None)  # import raises ImportError
    install_attention("sage")
    assert any("sageattention is not usable" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert attention_stats().sage is None
    assert attention_stats().order == ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]
    q = torch.randn(1, 2, 16, 8)
    F.scaled_dot_product_attention(q, q, q)


def test_sage_without_the_expected_parameters_is_refused(stand_in_gpu, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    module = types.ModuleType("sageattention")
    module.sageattn = lambda q, k, v, **kwargs: q  # type: ignore[attr-defined]
    module.__version__ = "9.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sageattention", module)
    install_attention("sage")
    assert attention_stats().sage is None
    assert any("no parameter" in r.getMessage() for r in caplog.records)


def test_a_sage_failure_at_run_time_switches_it_off_and_the_call_completes(stand_in_gpu, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    calls: list[dict] = []
    module = _fake_sage_module("1.0.6", calls)
    real = module.sageattn

    @functools.wraps(real)  # keeps sageattn's signature, which the loader checks
    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        real(*args, **kwargs)
        raise RuntimeError("triton compilation failed")

    module.sageattn = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sageattention", module)
    install_attention("sage")
    q, k, v = _long_call()
    with attention_caller("krea2_denoise"):
        out = F.scaled_dot_product_attention(q, k, v)
        F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert len(calls) == 1, "sage must not be tried again after it failed"
    stats = attention_stats()
    assert stats.sage is None
    assert stats.counts["krea2_denoise"] == {"FLASH_ATTENTION": 2}
    assert [e.event for e in stats.events] == ["sage_disabled"]
    assert any(
        "SageAttention failed in krea2_denoise: triton compilation failed" in r.getMessage() for r in caplog.records
    )


def test_a_sage_failure_in_a_call_that_outlived_its_install_leaves_the_undo_exact(stand_in_gpu, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Another thread uninstalls while Sage runs the call: switching Sage off would rebuild and put a patched SDPA
    # back after the exact undo, so the call is retried on the SDPA in place now instead.
    module = _fake_sage_module("1.0.6", [])
    real = module.sageattn

    @functools.wraps(real)
    def failing_after_an_uninstall(*args, **kwargs):  # type: ignore[no-untyped-def]
        uninstall_attention()
        raise RuntimeError("triton compilation failed")

    module.sageattn = failing_after_an_uninstall  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sageattention", module)
    original, before = F.scaled_dot_product_attention, read_flags()
    install_attention("sage")
    q, k, v = _long_call()
    out = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, original(q, k, v))
    assert F.scaled_dot_product_attention is original
    assert read_flags() == before
    stats = attention_stats()
    assert stats.installed is False and stats.events == []


# A call Sage takes: bf16, head_dim 64, long enough; priced with batch x heads as its heads.
SAGE_SHAPED = dict(
    dtype=torch.bfloat16, num_heads=4, query_len=SAGE_MIN_QUERY_LEN, key_len=SAGE_MIN_QUERY_LEN, head_dim=64
)


def _on_math(kv_heads: int | None = None, has_attn_mask: bool = False, is_causal: bool = False, **call) -> int:  # type: ignore[no-untyped-def]
    return PricedCall(
        device=torch.device("cpu"),
        kv_heads=call["num_heads"] if kv_heads is None else kv_heads,
        has_attn_mask=has_attn_mask,
        is_causal=is_causal,
        **call,
    ).math_bytes()


def _flash_without_a_mask(call: DispatchedCall) -> bool:
    return call.attn_mask is None


def test_a_call_sage_takes_is_priced_nothing(sage_calls, dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("MATH")
    install_attention("sage")
    assert sdpa_score_matrix_bytes(device="cpu", **SAGE_SHAPED) == 0
    assert sdpa_score_matrix_bytes(device="cpu", is_causal=True, **SAGE_SHAPED) == 0


@pytest.mark.parametrize("masks_served_by", ["MATH", "EFFICIENT_ATTENTION"])
def test_a_masked_sage_shaped_call_is_priced_on_the_kernel_that_serves_it(  # type: ignore[no-untyped-def]
    sage_calls, dispatcher, masks_served_by: str
) -> None:
    dispatcher({"FLASH_ATTENTION": _flash_without_a_mask, masks_served_by: lambda call: True})
    install_attention("sage")
    # Sage takes no mask: the kernel the dispatcher picks serves it, and math materialises the whole matrix.
    masked = sdpa_score_matrix_bytes(device="cpu", has_attn_mask=True, **SAGE_SHAPED)
    assert masked == (_on_math(has_attn_mask=True, **SAGE_SHAPED) if masks_served_by == "MATH" else 0)


@pytest.mark.parametrize(
    ("version", "priced_on_math"), [("1.0.6", True), ("2.2.0", False)], ids=["1.x: no grouped heads", "2.x"]
)
def test_a_grouped_query_call_is_priced_on_sage_only_where_sage_takes_it(  # type: ignore[no-untyped-def]
    stand_in_gpu, dispatcher, monkeypatch, version: str, priced_on_math: bool
) -> None:
    monkeypatch.setitem(sys.modules, "sageattention", _fake_sage_module(version, []))
    dispatcher("MATH")
    install_attention("sage")
    grouped = {**SAGE_SHAPED, "kv_heads": 2}
    assert sdpa_score_matrix_bytes(device="cpu", **grouped) == (_on_math(**grouped) if priced_on_math else 0)


def test_a_causal_call_of_unequal_lengths_is_priced_on_math(sage_calls, dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("MATH")
    install_attention("sage")
    call = {**SAGE_SHAPED, "key_len": SAGE_MIN_QUERY_LEN + 8}
    assert sdpa_score_matrix_bytes(device="cpu", **call) == 0
    assert sdpa_score_matrix_bytes(device="cpu", is_causal=True, **call) == _on_math(is_causal=True, **call)
