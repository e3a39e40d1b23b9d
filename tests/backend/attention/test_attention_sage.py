"""attention_backend: sage, with a stand-in sageattention module on the CPU standing in for CUDA."""

from __future__ import annotations

import functools
import logging
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from invokeai.backend.attention import attention_caller, attention_stats, install_attention, serving_kernel
from invokeai.backend.attention.sage import SAGE_MIN_QUERY_LEN


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
    assert [e["event"] for e in stats.events] == ["sage_disabled"]
    assert any(
        "SageAttention failed in krea2_denoise: triton compilation failed" in r.getMessage() for r in caplog.records
    )
