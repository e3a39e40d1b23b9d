"""Measured autotuning (`attention_autotune: on`): each shape bucket's first call times the kernels that can serve
it, the fastest is ranked first for the bucket, the choice is kept per GPU, torch and cuDNN, and the working-memory
estimate prices it.

On the CPU the timings come from a stand-in clock (`autotune.measure`), so that every choice is deterministic. Where
a GPU's several kernels are needed, the CPU stands in for one (conftest's `stand_in_gpu` and `dispatcher`) and each
fused kernel's run is stood in for by math, recorded; the real CPU dispatcher (flash or math) is asked too. The
CUDA-gated tests at the end time PyTorch's real kernels.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from invokeai.backend.attention import (
    attention_caller,
    attention_stats,
    autotune,
    install_attention,
    kernels,
    policy,
    sdpa_score_matrix_bytes,
    serving_kernel,
)
from invokeai.backend.attention.architecture import DeviceFacts
from invokeai.backend.attention.autotune import BUDGET_MS, REPEATS, TUNED, bucket_key, bucket_length
from invokeai.backend.attention.memory import PricedCall
from invokeai.backend.attention.testing import GPU_RULES

FLASH, CUDNN, EFFICIENT, MATH = "FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"
REAL_SDPA = F.scaled_dot_product_attention


class StandInClock:
    """`autotune.measure` with a fixed time per kernel: each run still runs (its output is checked), and each is
    recorded. `gate`, when set, is waited for inside the first timed run (to hold a tuning thread mid-timing)."""

    def __init__(self, ms: dict[str, float]) -> None:
        self.ms = ms
        self.runs: list[str] = []
        self.gate: threading.Event | None = None
        self.started = threading.Event()

    def __call__(
        self, kernel: str, device: torch.device, run: Callable[[], torch.Tensor]
    ) -> tuple[torch.Tensor, float]:
        self.runs.append(kernel)
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        return run(), self.ms.get(kernel, 1.0) / 1000

    def count(self, kernel: str) -> int:
        return self.runs.count(kernel)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, float]], StandInClock]:
    def make(ms: dict[str, float]) -> StandInClock:
        stand_in = StandInClock(ms)
        monkeypatch.setattr(autotune, "measure", stand_in)
        return stand_in

    return make


@pytest.fixture
def fused_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The fused kernels' runs on CPU tensors: recorded, and stood in for by math (which gives the same result)."""
    ran: list[str] = []

    def stand_in(name: str) -> Callable[..., torch.Tensor]:
        def run(q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
            ran.append(name)
            return kernels.math_kernel(q, k, v, m, d, c, s, g)

        return run

    monkeypatch.setattr(kernels, "runs_on", lambda kernel, tensor: kernel in kernels.RUNS)
    for name in (FLASH, CUDNN, EFFICIENT):
        run = stand_in(name)
        monkeypatch.setitem(kernels.RUNS, name, run)
        monkeypatch.setattr(TUNED[name], "run", run)
    return ran


@pytest.fixture
def gpu(stand_in_gpu: None, dispatcher, fused_runs: list[str]) -> list[str]:  # type: ignore[no-untyped-def]
    """A stand-in GPU: flash takes no mask, the memory-efficient kernel no grouped-query call, cuDNN and math all."""
    dispatcher(GPU_RULES)
    return fused_runs


def _qkv(
    length: int = 64, heads: int = 4, kv_heads: int | None = None, head_dim: int = 16, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, length, head_dim, generator=generator)
    k = torch.randn(2, kv_heads or heads, length, head_dim, generator=generator)
    return q, k, torch.randn_like(k)


def _math(q, k, v, **kwargs) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with sdpa_kernel([SDPBackend.MATH]):
        return REAL_SDPA(q, k, v, **kwargs)


def _only(tuned: list) -> object:  # type: ignore[type-arg]
    assert len(tuned) == 1, tuned
    return tuned[0]


# --- Buckets -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "bucket"), [(1, 1), (2, 2), (3, 4), (64, 64), (77, 128), (4096, 4096), (4608, 8192)]
)
def test_lengths_round_up_to_powers_of_two(length: int, bucket: int) -> None:
    assert bucket_length(length) == bucket


def test_a_bucket_is_device_dtype_head_size_lengths_heads_grouping_and_mask_kind() -> None:
    q, k, _ = _qkv(length=77, heads=8, kv_heads=2)
    bool_mask = torch.ones(77, 77, dtype=torch.bool)
    assert bucket_key(q, k, None, False) == (torch.device("cpu"), torch.float32, 16, 128, 128, 8, True, "none")
    assert bucket_key(q, k, None, True)[-1] == "causal"
    assert bucket_key(q, k, bool_mask, False)[-1] == "bool"
    assert bucket_key(q, k, torch.zeros(77, 77), False)[-1] == "additive"
    assert bucket_key(q, q, None, False)[-2] is False


# --- Choosing and serving on a stand-in GPU ------------------------------------------------------------------------


def test_the_fastest_kernel_is_chosen_and_serves_the_buckets_later_calls(gpu, clock) -> None:  # type: ignore[no-untyped-def]
    timer = clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True)
    assert "autotune" in attention_stats().layers
    q, k, v = _qkv()
    assert serving_kernel(q, k, v) is SDPBackend.FLASH_ATTENTION  # untuned: the order's choice
    with attention_caller("denoise"):
        first = F.scaled_dot_product_attention(q, k, v)
    choice = _only(attention_stats().tuned)
    assert choice.kernel == CUDNN and choice.source == "measured"
    assert [(t.kernel, t.ms, t.runs) for t in choice.timings] == [
        (FLASH, 3.0, REPEATS),
        (CUDNN, 1.0, REPEATS),
        (EFFICIENT, 2.0, REPEATS),
        (MATH, 9.0, REPEATS),
    ]
    assert choice.bucket.query_len == 64 and choice.bucket.heads == 4 and choice.bucket.mask == "none"
    # One warm-up and REPEATS timed runs per kernel, once.
    assert all(timer.count(name) == 1 + REPEATS for name in (FLASH, CUDNN, EFFICIENT, MATH))
    assert serving_kernel(q, k, v) is SDPBackend.CUDNN_ATTENTION
    gpu.clear()
    q2, k2, v2 = _qkv(length=50, seed=1)  # 50 rounds up to the same bucket
    with attention_caller("denoise"):
        second = F.scaled_dot_product_attention(q2, k2, v2)
    assert gpu == [CUDNN]
    assert len(timer.runs) == 4 * (1 + REPEATS)  # not timed again
    torch.testing.assert_close(first, _math(q, k, v))
    torch.testing.assert_close(second, _math(q2, k2, v2))
    # The tuning call and the later one, each counted once, under the kernel that served it.
    assert attention_stats().counts["denoise"] == {CUDNN: 2}


def test_a_call_the_tuned_kernel_cannot_serve_runs_on_the_order(gpu, dispatcher, clock) -> None:  # type: ignore[no-untyped-def]
    # cuDNN here refuses lengths that are not a multiple of 8: set-priority, not exclusive.
    dispatcher({**GPU_RULES, CUDNN: lambda call: call.query.shape[2] % 8 == 0})
    clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True)
    F.scaled_dot_product_attention(*_qkv(length=64))
    assert _only(attention_stats().tuned).kernel == CUDNN
    q, k, v = _qkv(length=63)
    assert serving_kernel(q, k, v) is SDPBackend.FLASH_ATTENTION
    with attention_caller("odd"):
        out = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, _math(q, k, v))
    assert attention_stats().counts["odd"] == {FLASH: 1}


def test_each_mask_kind_is_its_own_bucket(gpu, clock) -> None:  # type: ignore[no-untyped-def]
    clock({FLASH: 1.0, CUDNN: 3.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True)
    q, k, v = _qkv()
    bool_mask = torch.rand(2, 1, 64, 64, generator=torch.Generator().manual_seed(3)) > 0.3
    F.scaled_dot_product_attention(q, k, v)
    with attention_caller("masked"):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask)
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
    kinds = {choice.bucket.mask: choice for choice in attention_stats().tuned}
    assert sorted(kinds) == ["bool", "causal", "none"]
    assert kinds["none"].kernel == FLASH
    # Flash takes no mask: cuDNN (the dispatcher's choice), the memory-efficient kernel and math were timed.
    assert [t.kernel for t in kinds["bool"].timings] == [CUDNN, EFFICIENT, MATH]
    assert kinds["bool"].kernel == EFFICIENT
    torch.testing.assert_close(out, _math(q, k, v, attn_mask=bool_mask))
    assert attention_stats().counts["masked"] == {EFFICIENT: 1}


def test_a_kernel_whose_output_differs_is_not_chosen(gpu, clock, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def wrong(q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        return torch.zeros_like(q)

    monkeypatch.setitem(kernels.RUNS, CUDNN, wrong)
    monkeypatch.setattr(TUNED[CUDNN], "run", wrong)
    clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True)
    q, k, v = _qkv()
    out = F.scaled_dot_product_attention(q, k, v)
    choice = _only(attention_stats().tuned)
    assert choice.kernel == EFFICIENT
    cudnn = next(t for t in choice.timings if t.kernel == CUDNN)
    assert cudnn.ms is None and "differs" in (cudnn.note or "")
    torch.testing.assert_close(out, _math(q, k, v))


def test_a_kernel_that_fails_is_not_chosen_and_the_call_completes(gpu, clock, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def broken(q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        raise RuntimeError("cuDNN Frontend error: No execution plans support the graph.")

    monkeypatch.setitem(kernels.RUNS, CUDNN, broken)
    clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True)
    q, k, v = _qkv()
    out = F.scaled_dot_product_attention(q, k, v)
    choice = _only(attention_stats().tuned)
    assert choice.kernel == EFFICIENT
    assert next(t for t in choice.timings if t.kernel == CUDNN).note == (
        "failed: cuDNN Frontend error: No execution plans support the graph."
    )
    torch.testing.assert_close(out, _math(q, k, v))


def test_the_timing_cost_of_a_bucket_is_bounded_and_logged(gpu, clock, caplog) -> None:  # type: ignore[no-untyped-def]
    # Each run "takes" 60 ms: the 200 ms budget is spent within the second kernel; the rest are skipped.
    timer = clock({FLASH: 60.0, CUDNN: 60.0, EFFICIENT: 60.0, MATH: 60.0})
    install_attention("auto", "cpu", autotune=True)
    with caplog.at_level(logging.INFO, logger="invokeai.backend.attention.autotune"):
        F.scaled_dot_product_attention(*_qkv())
    choice = _only(attention_stats().tuned)
    spent_ms = 60.0 * len(timer.runs)
    assert spent_ms <= BUDGET_MS + 2 * 60.0  # the budget, and at most the run that crossed it and one warm-up
    assert [t.kernel for t in choice.timings] == [FLASH, CUDNN, EFFICIENT, MATH]
    skipped = [t for t in choice.timings if t.ms is None]
    assert skipped and all("budget was spent" in (t.note or "") for t in skipped)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "invokeai.backend.attention.autotune"]
    assert "timing took" in line and "chosen" in line and "skipped" in line


def test_math_is_not_timed_where_its_scores_would_take_too_much_memory(gpu, clock, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(autotune, "MATH_LIMIT_BYTES", 1024)
    timer = clock({FLASH: 3.0, CUDNN: 2.0, EFFICIENT: 2.5, MATH: 0.1})
    install_attention("auto", "cpu", autotune=True)
    F.scaled_dot_product_attention(*_qkv())
    choice = _only(attention_stats().tuned)
    assert choice.kernel == CUDNN and timer.count(MATH) == 0
    assert "score matrix" in (next(t for t in choice.timings if t.kernel == MATH).note or "")


def test_calls_outside_the_buckets_are_not_tuned(gpu, clock) -> None:  # type: ignore[no-untyped-def]
    timer = clock({})
    install_attention("auto", "cpu", autotune=True)
    q, k, v = _qkv()
    F.scaled_dot_product_attention(q[0], k[0], v[0])  # 3-D
    F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)  # dropout: random, nothing to compare
    with torch.enable_grad():
        F.scaled_dot_product_attention(q.requires_grad_(), k, v)  # autograd: not an inference call
    assert attention_stats().tuned == [] and timer.runs == []


def test_two_threads_reaching_one_bucket_time_it_once(gpu, clock) -> None:  # type: ignore[no-untyped-def]
    timer = clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    timer.gate = threading.Event()
    install_attention("auto", "cpu", autotune=True)
    results: dict[str, torch.Tensor] = {}

    def first() -> None:
        with attention_caller("first"):
            results["first"] = F.scaled_dot_product_attention(*_qkv())

    tuning = threading.Thread(target=first)
    tuning.start()
    assert timer.started.wait(30)  # the first thread holds the bucket's claim, inside its timing
    q, k, v = _qkv(seed=2)
    # Meanwhile the other call runs on the installed order, without waiting and without timing.
    assert serving_kernel(q, k, v) is SDPBackend.FLASH_ATTENTION
    with attention_caller("second"):
        results["second"] = F.scaled_dot_product_attention(q, k, v)
    assert attention_stats().counts["second"] == {FLASH: 1}
    runs_meanwhile = len(timer.runs)
    timer.gate.set()
    tuning.join(30)
    assert not tuning.is_alive()
    assert runs_meanwhile == 1
    assert all(timer.count(name) == 1 + REPEATS for name in (FLASH, CUDNN, EFFICIENT, MATH))
    assert _only(attention_stats().tuned).kernel == CUDNN
    assert attention_stats().counts["first"] == {CUDNN: 1}
    torch.testing.assert_close(results["second"], _math(q, k, v))


def test_many_threads_tune_each_bucket_once(gpu, clock) -> None:  # type: ignore[no-untyped-def]
    timer = clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True)
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def call(seed: int) -> None:
        try:
            barrier.wait(30)
            q, k, v = _qkv(length=32 + seed, seed=seed)  # 33..38: one bucket (64)
            torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v), _math(q, k, v))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=call, args=(seed,)) for seed in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(attention_stats().tuned) == 1
    assert len(timer.runs) == 4 * (1 + REPEATS)


# --- Pins, guards, demotion ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["cudnn", "flash", "efficient", "math"])
def test_a_pin_overrides_tuning(setting: str, gpu, clock) -> None:  # type: ignore[no-untyped-def]
    timer = clock({})
    install_attention(setting, "cpu", autotune=True)
    F.scaled_dot_product_attention(*_qkv())
    stats = attention_stats()
    assert stats.autotune == "pinned" and "autotune" not in stats.layers
    assert stats.tuned == [] and timer.runs == []


def test_sage_keeps_tuning_for_the_calls_sage_does_not_take(gpu, clock) -> None:  # type: ignore[no-untyped-def]
    clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("sage", "cpu", autotune=True)  # sageattention is not installed here: auto's order
    F.scaled_dot_product_attention(*_qkv())
    assert attention_stats().autotune == "on"
    assert _only(attention_stats().tuned).kernel == CUDNN


def test_off_composes_no_layer() -> None:
    install_attention("auto", "cpu")
    stats = attention_stats()
    assert stats.autotune == "off" and "autotune" not in stats.layers and stats.tuned == []


def _sm100(monkeypatch: pytest.MonkeyPatch) -> None:
    facts = DeviceFacts(platform="cuda", device_type="cuda", capability=(10, 0), cudnn_version=91600)
    monkeypatch.setattr(policy, "device_facts", lambda device, capability, cudnn: facts)


def test_the_cudnn_guard_keeps_few_key_value_heads_off_a_tuned_cudnn(gpu, dispatcher, clock, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # sm100 with cuDNN deprioritized: flash first, cuDNN eligible, and the guard composed. cuDNN would be fastest.
    _sm100(monkeypatch)
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    dispatcher({FLASH: lambda call: call.attn_mask is None, CUDNN: lambda call: True, MATH: lambda call: True})
    clock({FLASH: 3.0, CUDNN: 1.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True)
    assert "cudnn_guard" in attention_stats().layers
    few = _qkv(heads=8, kv_heads=4)
    out = F.scaled_dot_product_attention(*few, enable_gqa=True)
    (choice,) = attention_stats().tuned
    assert choice.kernel == FLASH and CUDNN not in [t.kernel for t in choice.timings]
    torch.testing.assert_close(out, _math(*few, enable_gqa=True))
    F.scaled_dot_product_attention(*_qkv(heads=8, kv_heads=8), enable_gqa=True)
    assert attention_stats().tuned[1].kernel == CUDNN


def test_a_tuned_cudnn_that_fails_is_demoted_and_not_used_again(gpu, clock, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True)
    F.scaled_dot_product_attention(*_qkv())
    assert _only(attention_stats().tuned).kernel == CUDNN

    def broken(q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        raise RuntimeError("CUDNN_STATUS_BAD_PARAM")

    monkeypatch.setattr(TUNED[CUDNN], "run", broken)
    q, k, v = _qkv(seed=5)
    with attention_caller("after"):
        out = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, _math(q, k, v))
    stats = attention_stats()
    assert stats.cudnn_demoted and [e.event for e in stats.events] == ["cudnn_demoted"]
    assert serving_kernel(q, k, v) is SDPBackend.FLASH_ATTENTION
    assert CUDNN not in stats.counts["after"]


# --- The working-memory estimate -----------------------------------------------------------------------------------


def _price(**kwargs) -> int:  # type: ignore[no-untyped-def]
    return sdpa_score_matrix_bytes(device="cpu", dtype=torch.float32, head_dim=16, batch=2, **kwargs)


def test_the_estimate_prices_the_tuned_kernel(gpu, clock) -> None:  # type: ignore[no-untyped-def]
    clock({FLASH: 3.0, CUDNN: 2.0, EFFICIENT: 2.5, MATH: 1.0})  # math "fastest" for this bucket
    install_attention("auto", "cpu", autotune=True)
    assert _price(num_heads=8, query_len=64, key_len=64) == 0  # before tuning: flash, the order's choice
    F.scaled_dot_product_attention(*_qkv())  # batch 2, 4 heads, 64 x 64
    assert _only(attention_stats().tuned).kernel == MATH
    call = PricedCall(torch.device("cpu"), torch.float32, 8, 8, 60, 60, 16, False, False, batch=2)
    assert _price(num_heads=8, query_len=60, key_len=60) == call.math_bytes() > 0
    assert _price(num_heads=8, query_len=200, key_len=200) == 0  # another bucket: untuned, flash


def test_the_estimate_prices_a_tuned_fused_kernel_at_nothing(gpu, clock) -> None:  # type: ignore[no-untyped-def]
    clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.5, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True)
    mask = torch.zeros(2, 1, 64, 64)
    F.scaled_dot_product_attention(*_qkv(), attn_mask=mask)
    assert _only(attention_stats().tuned).kernel == CUDNN
    assert _price(num_heads=8, query_len=64, key_len=64, has_attn_mask=True) == 0


# --- The autotune file ---------------------------------------------------------------------------------------------


@pytest.fixture
def tuned_file(tmp_path: Path) -> Path:
    return tmp_path / "root" / "attention_autotune.json"


def test_a_later_start_reuses_the_choices(gpu, clock, tuned_file: Path) -> None:  # type: ignore[no-untyped-def]
    timer = clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True, autotune_file=tuned_file)
    F.scaled_dot_product_attention(*_qkv())
    data = json.loads(tuned_file.read_text())
    assert data["format"] == 1
    ((key, entry),) = data["machines"].items()
    assert entry["torch"] == torch.__version__ and key.startswith(entry["device"])
    assert [c["kernel"] for c in entry["choices"]] == [CUDNN]
    assert attention_stats().autotune_file == str(tuned_file)

    install_attention("auto", "cpu")  # a restart, as far as the state goes
    timer.runs.clear()
    install_attention("auto", "cpu", autotune=True, autotune_file=tuned_file)
    q, k, v = _qkv(seed=4)
    assert serving_kernel(q, k, v) is SDPBackend.CUDNN_ATTENTION  # before its first call: read from the file
    with attention_caller("restarted"):
        out = F.scaled_dot_product_attention(q, k, v)
    assert timer.runs == []
    choice = _only(attention_stats().tuned)
    assert choice.kernel == CUDNN and choice.source == "file" and choice.cost_ms == 0.0
    assert [t.kernel for t in choice.timings] == [FLASH, CUDNN, EFFICIENT, MATH]
    assert attention_stats().counts["restarted"] == {CUDNN: 1}
    torch.testing.assert_close(out, _math(q, k, v))


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"format": 99, "machines": {}}',
        '{"format": 1, "machines": {"x": {"choices": [{"bucket": {}, "kernel": "FLASH_ATTENTION"}]}}}',
        '{"format": 1, "machines": {"x": {"choices": [{"bucket": {"dtype": "float32", "head_dim": 16, '
        '"query_len": 64, "key_len": 64, "heads": 4, "grouped": false, "mask": "none"}, "kernel": "SAGE"}]}}}',
    ],
    ids=["not-json", "not-a-mapping", "other-format", "bad-bucket", "unknown-kernel"],
)
def test_a_corrupt_file_is_ignored_with_a_warning_and_replaced(gpu, clock, tuned_file: Path, caplog, text: str) -> None:  # type: ignore[no-untyped-def]
    tuned_file.parent.mkdir(parents=True)
    tuned_file.write_text(text)
    timer = clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    with caplog.at_level(logging.WARNING):
        install_attention("auto", "cpu", autotune=True, autotune_file=tuned_file)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(tuned_file) in warning and "ignored" in warning
    F.scaled_dot_product_attention(*_qkv())
    assert timer.runs and _only(attention_stats().tuned).source == "measured"
    assert json.loads(tuned_file.read_text())["format"] == 1


def test_a_foreign_machines_choices_are_not_used_but_kept(gpu, clock, tuned_file: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    foreign_choice = {
        "bucket": {
            "dtype": "float32",
            "head_dim": 16,
            "query_len": 64,
            "key_len": 64,
            "heads": 4,
            "grouped": False,
            "mask": "none",
        },
        "kernel": "MATH",
        "timings": [],
    }
    foreign = {"device": "NVIDIA H200", "torch": "2.13.0+cu130", "cudnn": "91600", "choices": [foreign_choice]}
    tuned_file.parent.mkdir(parents=True)
    tuned_file.write_text(json.dumps({"format": 1, "machines": {"NVIDIA H200 | torch 2.13.0+cu130": foreign}}))
    clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True, autotune_file=tuned_file)
    with caplog.at_level(logging.WARNING):
        F.scaled_dot_product_attention(*_qkv())
    assert any("NVIDIA H200" in r.getMessage() and "not used" in r.getMessage() for r in caplog.records)
    assert _only(attention_stats().tuned).kernel == CUDNN
    machines = json.loads(tuned_file.read_text())["machines"]
    assert machines["NVIDIA H200 | torch 2.13.0+cu130"] == foreign and len(machines) == 2


def test_a_root_that_cannot_be_written_keeps_tuning_in_memory(gpu, clock, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    clock({FLASH: 3.0, CUDNN: 1.0, EFFICIENT: 2.0, MATH: 9.0})
    install_attention("auto", "cpu", autotune=True, autotune_file=blocker / "attention_autotune.json")
    with caplog.at_level(logging.WARNING):
        F.scaled_dot_product_attention(*_qkv())
        F.scaled_dot_product_attention(*_qkv(length=200))
    assert len(attention_stats().tuned) == 2
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1


# --- The real CPU dispatcher ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fastest", "served"), [(MATH, SDPBackend.MATH), (FLASH, SDPBackend.FLASH_ATTENTION)])
def test_on_the_real_cpu_dispatcher_flash_and_math_are_timed(clock, fastest: str, served: SDPBackend) -> None:  # type: ignore[no-untyped-def]
    # The CPU has flash (the dispatcher's choice, run through PyTorch's SDPA) and math (through its aten operator).
    clock({FLASH: 2.0 if fastest == FLASH else 5.0, MATH: 2.0 if fastest == MATH else 5.0})
    install_attention("auto", "cpu", autotune=True)
    q, k, v = _qkv(heads=8, kv_heads=2)
    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    choice = _only(attention_stats().tuned)
    assert [t.kernel for t in choice.timings] == [FLASH, MATH] and choice.kernel == fastest
    assert serving_kernel(q, k, v, enable_gqa=True) is served
    with attention_caller("cpu"):
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert attention_stats().counts["cpu"] == {served.name: 1}
    torch.testing.assert_close(out, _math(q, k, v, enable_gqa=True), atol=1e-5, rtol=1e-5)


def test_on_the_real_cpu_with_its_real_clock_outputs_stay_within_tolerance() -> None:
    install_attention("auto", "cpu", autotune=True)
    q, k, v = _qkv(length=128, heads=4)
    mask = torch.rand(2, 1, 128, 128, generator=torch.Generator().manual_seed(1)) > 0.2
    for kwargs in ({}, {"attn_mask": mask}, {"is_causal": True}):
        for _ in range(2):  # the tuning call, then a tuned one
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            torch.testing.assert_close(out, _math(q, k, v, **kwargs), atol=1e-5, rtol=1e-5)
    tuned = attention_stats().tuned
    assert len(tuned) == 3
    for choice in tuned:
        assert choice.kernel in (FLASH, MATH) and choice.source == "measured"
        assert choice.cost_ms > 0 and any(t.ms for t in choice.timings)


# --- A real CUDA device --------------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def on_cuda() -> Iterator[None]:
    yield
    torch.cuda.empty_cache()


def _cuda_qkv(heads: int, kv_heads: int, length: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(1, heads, length, head_dim, generator=generator, device="cuda", dtype=dtype)
    k = torch.randn(1, kv_heads, length, head_dim, generator=generator, device="cuda", dtype=dtype)
    return q, k, torch.randn_like(k)


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", ["plain", "additive-mask", "bool-mask", "causal", "grouped"])
def test_on_cuda_every_kernel_that_can_serve_is_timed_and_the_choice_serves(
    on_cuda: None, tmp_path: Path, dtype: torch.dtype, case: str
) -> None:
    heads, kv_heads = (16, 4) if case == "grouped" else (8, 8)
    q, k, v = _cuda_qkv(heads, kv_heads, 1024, 128, dtype)
    kwargs: dict[str, object] = {"enable_gqa": True} if case == "grouped" else {}
    if case == "additive-mask":
        kwargs["attn_mask"] = torch.randn(1, 1, 1024, 1024, device="cuda", dtype=dtype)
    elif case == "bool-mask":
        kwargs["attn_mask"] = torch.rand(1, 1, 1024, 1024, device="cuda") > 0.1
    elif case == "causal":
        kwargs["is_causal"] = True
    install_attention("auto", "cuda", autotune=True, autotune_file=tmp_path / "attention_autotune.json")
    with attention_caller("cuda_tuning"):
        first = F.scaled_dot_product_attention(q, k, v, **kwargs)
        second = F.scaled_dot_product_attention(q, k, v, **kwargs)
    choice = _only(attention_stats().tuned)
    timed = [t for t in choice.timings if t.ms is not None]
    assert timed and choice.kernel in [t.kernel for t in timed], choice
    assert choice.cost_ms < BUDGET_MS + 2000  # the budget, plus one warm-up (cuDNN plans) and one run
    assert min(t.ms for t in timed) == next(t.ms for t in timed if t.kernel == choice.kernel)
    assert serving_kernel(q, k, v, **kwargs).name == choice.kernel
    assert attention_stats().counts["cuda_tuning"] == {choice.kernel: 2}
    reference = _math(
        q.float(),
        k.float(),
        v.float(),
        **{
            key: (value.float() if isinstance(value, torch.Tensor) and value.dtype != torch.bool else value)
            for key, value in kwargs.items()
        },
    )
    for out in (first, second):
        torch.testing.assert_close(out.float(), reference, atol=4e-2, rtol=4e-2)
    # Each kernel's own run (the tuned route) agrees with PyTorch's SDPA running that kernel alone.
    for timing in timed:
        if timing.kernel == MATH:
            continue
        run = kernels.RUNS[timing.kernel](
            q, k, v, kwargs.get("attn_mask"), 0.0, bool(kwargs.get("is_causal")), None, bool(kwargs.get("enable_gqa"))
        )
        with sdpa_kernel([getattr(SDPBackend, timing.kernel)]):
            alone = REAL_SDPA(q, k, v, **kwargs)
        torch.testing.assert_close(run, alone, atol=2e-2, rtol=2e-2)
    assert json.loads((tmp_path / "attention_autotune.json").read_text())["machines"]


@cuda
@pytest.mark.cuda
def test_on_cuda_a_restart_reuses_the_file_without_timing(on_cuda: None, tmp_path: Path, clock) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "attention_autotune.json"
    q, k, v = _cuda_qkv(24, 24, 4096, 128, torch.bfloat16)  # FLUX.1's joint attention, batch 1
    install_attention("auto", "cuda", autotune=True, autotune_file=path)
    F.scaled_dot_product_attention(q, k, v)
    measured = _only(attention_stats().tuned)
    install_attention("auto", "cuda")
    timer = clock({})
    install_attention("auto", "cuda", autotune=True, autotune_file=path)
    F.scaled_dot_product_attention(q, k, v)
    reused = _only(attention_stats().tuned)
    assert timer.runs == [] and reused.source == "file" and reused.kernel == measured.kernel
    assert serving_kernel(q, k, v).name == measured.kernel
