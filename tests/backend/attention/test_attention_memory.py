"""sdpa_score_matrix_bytes: priced through the same dispatcher as the patch, and at least what math is measured to
use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from invokeai.backend import devices
from invokeai.backend.attention import install_attention, rocm_guard, sdpa_score_matrix_bytes
from invokeai.backend.attention.memory import PricedCall, bytes_per_score_element
from invokeai.backend.attention.testing import DispatchedCall

CALIBRATION = Path(__file__).resolve().parents[3] / "scripts" / "calibrate_sdpa_math_memory.py"

CALL: dict[str, Any] = dict(dtype=torch.bfloat16, num_heads=24, query_len=1024, key_len=1024, head_dim=128)
FULL = 24 * 1024 * 1024 * bytes_per_score_element("cpu", torch.bfloat16)
# The Krea-2 text encoder's attention unpadded: 77 tokens, 32 query heads sharing 8 key-value heads, head_dim 128.
TEXT_ENCODER: dict[str, Any] = dict(
    dtype=torch.float32, num_heads=32, kv_heads=8, query_len=77, key_len=77, head_dim=128
)


def _on_math(**call: Any) -> int:
    """The price of a call math serves: its scores, math's copies of its operands and its result."""
    kv_heads = call.pop("kv_heads", None)
    priced = PricedCall(
        device=torch.device(call.pop("device", "cpu")),
        kv_heads=call["num_heads"] if kv_heads is None else kv_heads,
        has_attn_mask=call.pop("has_attn_mask", False),
        is_causal=call.pop("is_causal", False),
        **call,
    )
    return priced.math_bytes()


def _any(call: DispatchedCall) -> bool:
    return True


def test_a_math_answer_prices_the_whole_matrix_and_maths_operands(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("MATH")
    install_attention("auto")
    price = sdpa_score_matrix_bytes(device="cpu", **CALL)
    assert price == _on_math(**CALL)
    # The scores dominate a long call; its operands and result (16-bit q, k, v in fp32 on the CPU) come on top.
    q_size = 24 * 1024 * 128
    assert price - FULL == q_size * (2 * 4 + 4 + 3 * 4 + 2)


def test_a_fused_answer_prices_nothing(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("EFFICIENT_ATTENTION", "MATH")
    install_attention("auto")
    assert sdpa_score_matrix_bytes(device="cpu", **CALL) == 0


def test_a_probe_that_raises_prices_the_matrix(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    install_attention("auto")

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("probe failed")

    monkeypatch.setattr(torch, "zeros", broken)
    assert sdpa_score_matrix_bytes(device="cpu", **CALL) == _on_math(**CALL)


def test_no_kernel_at_all_prices_the_matrix(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher()
    install_attention("auto")
    assert sdpa_score_matrix_bytes(device="cpu", **CALL) == _on_math(**CALL)


def test_pinned_math_prices_exactly_maths_bytes_more_than_auto(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    install_attention("auto")
    auto = sdpa_score_matrix_bytes(device="cpu", **CALL)
    install_attention("math")
    pinned = sdpa_score_matrix_bytes(device="cpu", **CALL)
    assert pinned - auto == _on_math(**CALL) > FULL


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


# Each rule serves FLASH only for some kind of call, and MATH everything: a probe that loses what the rule reads
# prices the call on the wrong kernel.
PROBED = {
    "the causal flag": (lambda call: not call.is_causal, dict(is_causal=True)),
    "the key-value heads": (lambda call: call.query.shape[1] == call.key.shape[1], dict(kv_heads=8)),
    "enable_gqa": (lambda call: not call.enable_gqa, dict(kv_heads=8)),
    "unequal lengths": (lambda call: call.query.shape[2] == call.key.shape[2], dict(key_len=77)),
}


@pytest.mark.parametrize("what", PROBED)
def test_the_probe_asks_with_the_priced_calls_layout(dispatcher, what: str) -> None:  # type: ignore[no-untyped-def]
    flash_rule, kind = PROBED[what]
    dispatcher({"FLASH_ATTENTION": flash_rule, "MATH": _any})
    install_attention("auto")
    call = {**CALL, "num_heads": 32}
    assert sdpa_score_matrix_bytes(device="cpu", **call) == 0
    assert sdpa_score_matrix_bytes(device="cpu", **{**call, **kind}) == _on_math(**{**call, **kind})


def test_the_real_cpu_dispatcher_serves_fp32_on_its_flash_kernel() -> None:
    install_attention("math")  # the CPU ignores the order
    assert (
        sdpa_score_matrix_bytes(device="cpu", dtype=torch.float32, num_heads=8, query_len=512, key_len=512, head_dim=64)
        == 0
    )


def test_the_real_cpu_dispatcher_serves_grouped_query_calls_on_flash_only_with_enable_gqa() -> None:
    # CPU flash takes grouped heads when enable_gqa is passed, and sends unequal heads without it to math: a probe
    # that dropped enable_gqa would price this call as math.
    install_attention("auto")
    assert sdpa_score_matrix_bytes(device="cpu", **TEXT_ENCODER) == 0
    assert sdpa_score_matrix_bytes(device="cpu", **{**TEXT_ENCODER, "is_causal": True}) == 0


def test_the_rocm_guard_caps_the_scores_per_chunk(dispatcher, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(devices, "is_rocm", lambda: True)
    dispatcher("MATH")
    install_attention("auto")
    long = {**CALL, "query_len": 65536, "key_len": 65536}
    operands = _on_math(**long) - 24 * 65536**2 * bytes_per_score_element("cpu", torch.bfloat16)
    assert sdpa_score_matrix_bytes(device="cpu", **long) == rocm_guard.MATH_CHUNK_BYTES + operands
    assert sdpa_score_matrix_bytes(device="cpu", **CALL) == _on_math(**CALL)


def test_a_causal_math_call_also_prices_its_mask(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("MATH")
    install_attention("auto")
    causal = sdpa_score_matrix_bytes(device="cpu", is_causal=True, **CALL)
    assert causal - sdpa_score_matrix_bytes(device="cpu", **CALL) == 1024 * 1024 * (torch.bfloat16.itemsize + 2)


def test_mps_counts_as_materialising() -> None:
    install_attention("auto")
    assert sdpa_score_matrix_bytes(device="mps", **CALL) == _on_math(device="mps", **CALL)


def test_16_bit_copies_in_fp32_are_priced_only_where_math_makes_them(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("MATH")
    install_attention("auto")
    upcast = sdpa_score_matrix_bytes(device="cpu", **CALL)
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        in_bf16 = sdpa_score_matrix_bytes(device="cpu", **CALL)
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)
    # q, k and v copied to fp32, the scaled query and key and the result in fp32 rather than bf16, the cast back.
    q_size = 24 * 1024 * 128
    assert upcast - in_bf16 == q_size * (3 * 4 + 3 * 2 + 2)


def test_grouped_query_calls_price_maths_repeated_key_and_value(dispatcher) -> None:  # type: ignore[no-untyped-def]
    dispatcher("MATH")
    install_attention("auto")
    grouped = sdpa_score_matrix_bytes(device="cpu", **TEXT_ENCODER)
    ungrouped = sdpa_score_matrix_bytes(device="cpu", **{**TEXT_ENCODER, "kv_heads": None})
    # Math repeats the 8 key-value heads up to the 32 query heads: a key and a value at 32 heads, in fp32.
    assert grouped - ungrouped >= 2 * 32 * 77 * 128 * 4


def _measured_growth(cases: list[tuple[dict[str, Any], str]]) -> list[int]:
    """math's peak-RSS growth per call, as the calibration script measures it: forked children of a fresh parent,
    the largest attention peak over several child pairs against the smallest baseline."""
    done = subprocess.run(
        [sys.executable, str(CALIBRATION), "--device", "cpu", "--growth", json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# (heads, kv heads, length, head_dim, dtype, mask) for the calibration script's Case, and the call as priced.
MEASURED = {
    "fp32, 32 query / 8 key-value heads": (32, 8, 77, 128, "float32", "none"),
    "fp32, 32 query / 8 key-value heads, causal": (32, 8, 77, 128, "float32", "causal"),
    "fp32, 32 heads": (32, None, 77, 128, "float32", "none"),
    "bf16, 32 query / 8 key-value heads": (32, 8, 77, 128, "bfloat16", "none"),
    "bf16, 32 heads, padding mask": (32, None, 77, 128, "bfloat16", "additive"),
}


def test_short_calls_with_wide_heads_are_priced_at_least_their_measured_growth(dispatcher) -> None:  # type: ignore[no-untyped-def]
    """The issue's example: a [32 q / 8 kv heads, 77x77, d128] fp32 call measured 6.3 MiB against 2.0 MiB priced,
    math's copies of q, k and v (the key and value repeated to the query heads) outweighing its scores."""
    cases = [
        (dict(heads=h, kv_heads=kv, query_len=n, key_len=n, head_dim=d, mask=mask), dtype)
        for h, kv, n, d, dtype, mask in MEASURED.values()
    ]
    growths = _measured_growth(cases)
    dispatcher("MATH")
    install_attention("auto")
    for name, growth in zip(MEASURED, growths, strict=True):
        heads, kv_heads, length, head_dim, dtype, mask = MEASURED[name]
        price = sdpa_score_matrix_bytes(
            device="cpu",
            dtype=getattr(torch, dtype),
            num_heads=heads,
            kv_heads=kv_heads,
            query_len=length,
            key_len=length,
            head_dim=head_dim,
            has_attn_mask=mask == "additive",
            is_causal=mask == "causal",
        )
        assert growth <= price <= 2 * growth, f"{name}: priced {price / 2**20:.2f} MiB, grew {growth / 2**20:.2f} MiB"
