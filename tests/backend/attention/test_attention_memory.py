"""sdpa_score_matrix_bytes: priced through the same dispatcher as the patch."""

from __future__ import annotations

import torch

from invokeai.backend.attention import devices, install, install_attention, sdpa_score_matrix_bytes
from invokeai.backend.attention.memory import bytes_per_score_element

CALL = dict(dtype=torch.bfloat16, num_heads=24, query_len=1024, key_len=1024, head_dim=128)
FULL = 24 * 1024 * 1024 * bytes_per_score_element("cpu", torch.bfloat16)


def test_a_math_answer_prices_the_whole_matrix(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("MATH")
    install_attention("auto")
    assert sdpa_score_matrix_bytes(device="cpu", **CALL) == FULL


def test_a_fused_answer_prices_nothing(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("EFFICIENT_ATTENTION", "MATH")
    install_attention("auto")
    assert sdpa_score_matrix_bytes(device="cpu", **CALL) == 0


def test_a_probe_that_raises_prices_the_matrix(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    install_attention("auto")

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("probe failed")

    monkeypatch.setattr(torch, "zeros", broken)
    assert sdpa_score_matrix_bytes(device="cpu", **CALL) == FULL


def test_no_kernel_at_all_prices_the_matrix(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher()
    install_attention("auto")
    assert sdpa_score_matrix_bytes(device="cpu", **CALL) == FULL


def test_pinned_math_prices_exactly_the_score_matrix_more_than_auto(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    install_attention("auto")
    auto = sdpa_score_matrix_bytes(device="cpu", **CALL)
    install_attention("math")
    pinned = sdpa_score_matrix_bytes(device="cpu", **CALL)
    assert pinned - auto == FULL


def test_the_mask_reaches_the_dispatcher(dispatcher, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    stand_in = dispatcher("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    masked = []
    real = stand_in.__call__
    monkeypatch.setattr(
        devices,
        "fused_sdp_choice",
        lambda q, k, v, m=None, *a, **kw: masked.append(m is not None) or real(q, k, v, m, *a, **kw),
    )
    install_attention("auto")
    sdpa_score_matrix_bytes(device="cpu", has_attn_mask=True, **CALL)
    sdpa_score_matrix_bytes(device="cpu", **CALL)
    assert masked == [True, False]


def test_mps_counts_as_materialising() -> None:
    install_attention("auto")
    assert sdpa_score_matrix_bytes(device="mps", **CALL) == 24 * 1024 * 1024 * bytes_per_score_element(
        "mps", torch.bfloat16
    )


def test_the_real_cpu_dispatcher_serves_fp32_on_its_flash_kernel() -> None:
    install_attention("math")  # the CPU ignores the order
    assert (
        sdpa_score_matrix_bytes(device="cpu", dtype=torch.float32, num_heads=8, query_len=512, key_len=512, head_dim=64)
        == 0
    )


def test_the_rocm_guard_caps_the_price_per_chunk(dispatcher, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(devices, "is_rocm", lambda: True)
    dispatcher("MATH")
    install_attention("auto")
    assert (
        sdpa_score_matrix_bytes(device="cpu", **{**CALL, "query_len": 65536, "key_len": 65536})
        == install.MATH_CHUNK_BYTES
    )
    assert sdpa_score_matrix_bytes(device="cpu", **CALL) == FULL


def test_a_causal_math_call_also_prices_its_mask(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("MATH")
    install_attention("auto")
    causal = sdpa_score_matrix_bytes(device="cpu", is_causal=True, **CALL)
    assert causal == FULL + 1024 * 1024 * (torch.bfloat16.itemsize + 2)
