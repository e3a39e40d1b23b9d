"""Unpatched PyTorch, every SDPA kernel alone and every `attention_backend` setting, timed on the same calls in one
run: the calls FLUX.1, SDXL, Krea-2 and a grouped-query text encoder make at 1024x1024 (benchmarks/_attention_calls.py),
in bf16 and fp16 on CUDA.

Per call, each candidate is timed in interleaved rounds (every candidate once per round, each round starting one
candidate later, so machine noise hits all alike) after one untimed warm-up round. A round's sample is the mean of
back-to-back calls between two device synchronizations, as a model launches them (as many calls for every candidate
of a call: enough for unpatched PyTorch to fill about 20 ms);
the table gives the median and the minimum sample, and every ratio printed is between figures of this run:

- unpatched: PyTorch's own SDPA with PyTorch's own flags and order, as if this package were not installed;
- kernel X: PyTorch's bare SDPA inside `sdpa_kernel([X])`, X alone ("n/a" when it cannot serve the call);
- setting S: `install_attention(S)`, then `F.scaled_dot_product_attention` as a model calls it (the wrapper included),
  with the kernel PyTorch's dispatcher says serves it (`serving_kernel`) and the kernels the wrapper counted;
- auto+autotune (where `install_attention` takes `autotune`): auto with measured autotuning on; its choice per
  bucket is kept in a scratch file, so only the first round pays for the timing.

Columns: vs unpatched = unpatched time / time (> 1 is faster than PyTorch left alone); peak MiB = on CUDA,
torch.cuda.max_memory_allocated during one call minus what was allocated before it ("-" on the CPU, whose allocator
no counter sees; scripts/calibrate_sdpa_math_memory.py measures math there); priced MiB = `sdpa_score_matrix_bytes`
for the call under that kernel or setting; max|diff| = largest absolute difference from the math kernel's output.

The target, per call (minimum samples, the estimate least disturbed by other processes): auto >= 1.00x unpatched,
and auto within 3% of the fastest pinned setting. A line per call says PASS or FAIL; `--strict` makes a FAIL the
exit status. Lines starting "figure:" are the ones scripts/gpu_check.sh copies into its summary.

Usage: PYTHONPATH=. python benchmarks/attention_kernels.py [--device cpu|cuda] [--tiny] [--dtypes bf16,fp16]
       [--calls-only LABEL,...] [--rounds N] [--quick] [--strict]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import logging
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _attention_calls import (
    MODEL_CALLS,
    TINY_CALLS,
    CallShape,
    add_call_arguments,
    chosen_calls,
    dispatcher_choice,
    dtype_name,
)
from torch.nn.attention import SDPBackend, sdpa_kernel

from invokeai.backend.attention import (
    attention_stats,
    install_attention,
    sdpa_score_matrix_bytes,
    serving_kernel,
    uninstall_attention,
)
from invokeai.backend.attention.policy import KernelFlags, apply_flags, read_flags, settle_pytorch_order

BARE = F.scaled_dot_product_attention
KERNELS = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)
PINS = ("cudnn", "flash", "efficient", "math")
SETTINGS = ("auto", *PINS)
AUTOTUNED = "auto+autotune"
UNPATCHED = "unpatched"
# The target: auto at least as fast as PyTorch left alone, and within 3% of the best pin.
UNPATCHED_TARGET = 1.00
PIN_TOLERANCE = 1.03
ROUND_SECONDS = 0.02
MAX_CALLS_PER_SAMPLE = 200
MiB = 2**20


@dataclass
class Result:
    name: str
    available: bool = True
    error: str = ""
    times: list[float] = field(default_factory=list)
    peak: int | None = None
    priced: int = 0
    serving: str = "-"
    ran_on: dict[str, int] = field(default_factory=dict)
    reports: list[str] = field(default_factory=list)
    tuned: list[str] = field(default_factory=list)
    max_diff: float | None = None
    call_seconds: float = 0.0  # the warm-up's second call
    calls: int = 1  # calls per sample: the same for every candidate of a call (`samples_per_call`)
    stderr: list[str] = field(default_factory=list)  # what the first round wrote (PyTorch's reasons for a report)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times) * 1000

    @property
    def min_ms(self) -> float:
        return min(self.times) * 1000


Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]


@contextlib.contextmanager
def unpatched(pytorch_flags: KernelFlags) -> Iterator[Callable[..., torch.Tensor]]:
    """PyTorch as it is without this package: its own SDPA, and its own flags and order (read at the start, after
    PyTorch ranked its kernels for the device)."""
    uninstall_attention()
    before = read_flags()
    apply_flags(pytorch_flags)
    try:
        yield BARE
    finally:
        apply_flags(before)


@contextlib.contextmanager
def kernel_alone(kernel: SDPBackend) -> Iterator[Callable[..., torch.Tensor]]:
    with sdpa_kernel([kernel]):
        yield BARE


@contextlib.contextmanager
def setting_installed(setting: str, device: torch.device, **options: Any) -> Iterator[Callable[..., torch.Tensor]]:
    install_attention(setting, device, **options)
    try:
        # Looked up after installing, the way diffusers and transformers look it up at call time.
        yield F.scaled_dot_product_attention
    finally:
        uninstall_attention()


def autotune_supported() -> bool:
    """Whether this checkout's `install_attention` takes `autotune` (measured autotuning, issue 26 section 2)."""
    return "autotune" in inspect.signature(install_attention).parameters


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call(function: Callable[..., torch.Tensor], inputs: Inputs) -> torch.Tensor:
    q, k, v, kwargs = inputs
    return function(q, k, v, **kwargs)


def _first_sentence(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0].split(". ")[0][:100] if text else type(error).__name__


def warm_up(
    result: Result,
    function: Callable[..., torch.Tensor],
    call: CallShape,
    device: torch.device,
    dtype: torch.dtype,
    inputs: Inputs,
    reference: torch.Tensor,
    is_setting: bool,
) -> None:
    """First round: whether the candidate runs at all, its peak memory, pricing, serving kernel and error, and how
    many calls make a sample."""
    q, k, v, kwargs = inputs
    result.priced = sdpa_score_matrix_bytes(device=device, dtype=dtype, **call.priced_kwargs())
    with warnings.catch_warnings():
        # PyTorch explains a refused kernel in UserWarnings; the table says "n/a".
        warnings.simplefilter("ignore")
        try:
            if is_setting:
                result.serving = str(getattr(serving_kernel(q, k, v, **kwargs), "name", "sage"))
            else:
                result.serving = dispatcher_choice(q, k, v, kwargs)
        except Exception:
            result.serving = "-"
        try:
            _sync(device)
            if device.type == "cuda":
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            out = _call(function, inputs)
            _sync(device)
            if device.type == "cuda":
                result.peak = torch.cuda.max_memory_allocated(device) - before
            # The first call pays for plans and allocations; the second tells how long a call takes.
            started = time.perf_counter()
            _call(function, inputs)
            _sync(device)
            seconds = time.perf_counter() - started
        except RuntimeError as error:
            result.available = False
            result.error = _first_sentence(error)
            return
    result.call_seconds = seconds
    result.max_diff = (out.float() - reference.float()).abs().max().item()


def calls_per_sample(results: list[Result]) -> int:
    """Back-to-back calls per sample, the same for every candidate of a call: enough for unpatched PyTorch's call
    (else the median candidate's) to fill ROUND_SECONDS. A shared machine disturbs a long loop more often than a
    short one, so candidates timed over different loop lengths would not compare."""
    ran = [r for r in results if r.available and r.call_seconds > 0]
    if not ran:
        return 1
    plain = next((r for r in ran if r.name == UNPATCHED), None)
    seconds = plain.call_seconds if plain is not None else statistics.median(r.call_seconds for r in ran)
    return max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(ROUND_SECONDS / max(seconds, 1e-6))))


def time_calls(result: Result, function: Callable[..., torch.Tensor], device: torch.device, inputs: Inputs) -> None:
    # One untimed call first: entering a candidate changes PyTorch's flags or reinstalls the wrapper (whose probe
    # empties the CUDA cache), and the first call after that may pay for allocations the steady state does not.
    _call(function, inputs)
    _sync(device)
    started = time.perf_counter()
    for _ in range(result.calls):
        _call(function, inputs)
    _sync(device)
    result.times.append((time.perf_counter() - started) / result.calls)


def collect_setting_stats(result: Result, timed: bool) -> None:
    """The distinct reports, the autotuner's choices and, for a timed round, the kernels the wrapper counted; read
    before uninstalling (installing resets them)."""
    stats = attention_stats()
    if timed:
        for per_kernel in stats.counts.values():
            for kernel, calls in per_kernel.items():
                result.ran_on[kernel] = result.ran_on.get(kernel, 0) + calls
    for report in stats.reports:
        if report.message not in result.reports:
            result.reports.append(report.message)
    for choice in getattr(stats, "tuned", []):
        timings = ", ".join(
            f"{t.kernel} {t.ms:.3f} ms" if t.ms is not None else f"{t.kernel} ({t.note})" for t in choice.timings
        )
        text = f"{choice.kernel} ({choice.source}; {timings})"
        if text not in result.tuned:
            result.tuned.append(text)


Candidate = tuple[Result, Callable[[], contextlib.AbstractContextManager], bool]


def candidates_for(
    device: torch.device, settings: tuple[str, ...], pytorch_flags: KernelFlags, tuning_file: Path | None
) -> list[Candidate]:
    candidates: list[Candidate] = [(Result(UNPATCHED), lambda: unpatched(pytorch_flags), False)]
    for kernel in KERNELS:
        candidates.append((Result(f"kernel {kernel.name}"), lambda kernel=kernel: kernel_alone(kernel), False))
    for setting in settings:
        candidates.append(
            (Result(f"setting {setting}"), lambda setting=setting: setting_installed(setting, device), True)
        )
    if tuning_file is not None:
        tuned = lambda: setting_installed("auto", device, autotune=True, autotune_file=tuning_file)  # noqa: E731
        candidates.append((Result(f"setting {AUTOTUNED}"), tuned, True))
    return candidates


def bench_call(
    call: CallShape, dtype: torch.dtype, device: torch.device, candidates: list[Candidate], rounds: int
) -> list[Result]:
    inputs = call.inputs(device, dtype)
    with sdpa_kernel([SDPBackend.MATH]):
        reference = _call(BARE, inputs)
    for round_index in range(rounds + 1):
        # Each round starts one candidate later, so that no candidate always runs right after the slow math one.
        shift = round_index % len(candidates)
        for result, context, is_setting in candidates[shift:] + candidates[:shift]:
            if not result.available:
                continue
            # Reports and PyTorch's reasons repeat on every install: the first round's go into the table.
            captured = io.StringIO()
            with contextlib.redirect_stderr(captured), context() as function:
                if round_index == 0:
                    warm_up(result, function, call, device, dtype, inputs, reference, is_setting)
                else:
                    time_calls(result, function, device, inputs)
                if is_setting:
                    collect_setting_stats(result, timed=round_index > 0)
            if round_index == 0:
                result.stderr = [line.strip() for line in captured.getvalue().splitlines() if line.strip()]
        if round_index == 0:
            calls = calls_per_sample([result for result, _, _ in candidates])
            for result, _, _ in candidates:
                result.calls = calls
    del reference, inputs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return [result for result, _, _ in candidates]


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:.1f}"


def print_call(title: str, results: list[Result]) -> None:
    print()
    print(title)
    reference = next((r for r in results if r.name == UNPATCHED and r.available and r.times), None)
    print(
        f"  {'candidate':26s} {'median ms':>10s} {'min ms':>9s} {'vs unpatched':>12s} {'peak MiB':>9s} "
        f"{'priced MiB':>10s} {'max|diff|':>9s}  serving kernel (calls counted by the wrapper)"
    )
    for result in results:
        if not result.available or not result.times:
            print(f"  {result.name:26s} {'n/a':>10s}  ({result.error or 'not timed'})")
            continue
        speedup = f"{reference.min_ms / result.min_ms:.2f}x" if reference is not None else "-"
        diff = "-" if result.max_diff is None else f"{result.max_diff:.1e}"
        ran_on = ", ".join(f"{kernel} x{calls}" for kernel, calls in sorted(result.ran_on.items()))
        serving = f"{result.serving} ({ran_on})" if ran_on else result.serving
        print(
            f"  {result.name:26s} {result.median_ms:10.3f} {result.min_ms:9.3f} {speedup:>12s} "
            f"{_mib(result.peak):>9s} {_mib(result.priced):>10s} {diff:>9s}  {serving}"
        )
        for message in result.reports:
            print(f"  {'':26s} report: {message}")
        for choice in result.tuned:
            print(f"  {'':26s} tuned: {choice}")
        for line in result.stderr[:8]:
            print(f"  {'':26s} stderr: {line}")


def _timed(results: list[Result], name: str) -> Result | None:
    return next((r for r in results if r.name == name and r.available and r.times), None)


def check_target(label: str, results: list[Result]) -> bool:
    """The issue's target on one call: auto >= 1.00x unpatched and within 3% of the fastest pin (minimum samples).
    Prints one "figure:" line."""
    auto, plain = _timed(results, "setting auto"), _timed(results, UNPATCHED)
    pins = [r for r in (_timed(results, f"setting {pin}") for pin in PINS) if r is not None]
    if auto is None or plain is None or not pins:
        print(f"figure: {label}: FAIL (auto, unpatched PyTorch or every pin could not run)")
        return False
    best = min(pins, key=lambda r: r.min_ms)
    vs_plain = plain.min_ms / auto.min_ms
    vs_best = auto.min_ms / best.min_ms
    plain_ok, best_ok = vs_plain >= UNPATCHED_TARGET, vs_best <= PIN_TOLERANCE
    note = ""
    if not plain_ok and auto.serving == plain.serving:
        # The same kernel serves both: what is left is the wrapper's per-call cost and the machine's noise.
        note = f" (same kernel {plain.serving}: the gap is the wrapper and noise)"
    line = (
        f"figure: {label}: unpatched {plain.min_ms:.3f} ms ({plain.serving}), auto {auto.min_ms:.3f} ms "
        f"({auto.serving}) = {vs_plain:.2f}x unpatched (>= {UNPATCHED_TARGET:.2f}x) {'PASS' if plain_ok else 'FAIL'}"
        f"{note}; best pin {best.name.removeprefix('setting ')} {best.min_ms:.3f} ms, auto {vs_best:.3f}x of it "
        f"(<= {PIN_TOLERANCE:.2f}) {'PASS' if best_ok else 'FAIL'}"
    )
    tuned = _timed(results, f"setting {AUTOTUNED}")
    if tuned is not None:
        line += (
            f"; auto+autotune {tuned.min_ms:.3f} ms ({tuned.serving}) = {plain.min_ms / tuned.min_ms:.2f}x unpatched"
        )
    print(line)
    return plain_ok and best_ok


def environment(device: torch.device) -> str:
    if device.type == "cuda":
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return (
            f"cuda ({torch.cuda.get_device_name(device)}, sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
            f", CUDA {torch.version.cuda}, cuDNN {cudnn})"
        )
    return f"cpu ({torch.get_num_threads()} threads)"


def measure(
    device: torch.device,
    dtypes: tuple[torch.dtype, ...],
    calls: tuple[CallShape, ...],
    settings: tuple[str, ...],
    rounds: int,
) -> list[bool]:
    """Every call in every dtype, printed as it is measured; the target's verdict per call."""
    uninstall_attention()
    # PyTorch ranks its kernels for the device at its first CUDA attention dispatch: let it, then keep what it chose.
    settle_pytorch_order(device)
    pytorch_flags = read_flags()

    print(f"attention kernels: torch {torch.__version__}, {environment(device)}")
    print(f"PyTorch's own order here: {[SDPBackend(b).name for b in pytorch_flags.order]}")
    print(
        f"{rounds} timed rounds after 1 warm-up round, candidates interleaved; a sample is the mean of back-to-back "
        "calls between two synchronizations; vs unpatched = unpatched min / min"
    )
    if device.type == "cpu":
        print("on the CPU PyTorch ignores the ranking (flash whenever it can serve), so every setting runs flash")
    passed: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="attention-kernels-") as scratch:
        tuning_file = Path(scratch) / "attention_autotune.json" if autotune_supported() else None
        if tuning_file is None:
            print("auto+autotune: not measured, this checkout's install_attention has no autotune option")
        candidates = candidates_for(device, settings, pytorch_flags, tuning_file)
        for dtype in dtypes:
            for call in calls:
                fresh = [(Result(result.name), context, is_setting) for result, context, is_setting in candidates]
                results = bench_call(call, dtype, device, fresh, rounds)
                print_call(call.describe(dtype), results)
                passed.append(check_target(f"{call.label} {dtype_name(dtype)}", results))
                sys.stdout.flush()  # a run cut short by its time limit keeps what it measured
    uninstall_attention()
    print()
    verdict = "PASS" if all(passed) else "FAIL"
    print(
        f"figure: target on this {device.type} (auto >= {UNPATCHED_TARGET:.2f}x unpatched and within "
        f"{PIN_TOLERANCE - 1:.0%} of the best pin, every call): {verdict} ({sum(passed)} of {len(passed)} calls)"
    )
    return passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_call_arguments(parser)
    parser.add_argument("--calls-only", help="comma-separated labels of the calls to run (default every one)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--rounds", type=int, help="timed rounds (default 12, quick 4)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the target fails on a call")
    args = parser.parse_args(argv)
    rounds = args.rounds or (4 if args.quick else 12)
    device, dtypes, calls = chosen_calls(parser, args)
    if args.calls_only:
        wanted = {label.strip() for label in args.calls_only.split(",")}
        calls = tuple(call for call in calls if call.label in wanted)
        if not calls:
            parser.error(f"--calls-only matches none of: {', '.join(c.label for c in (*MODEL_CALLS, *TINY_CALLS))}")
    settings = SETTINGS + (("sage",) if importlib.util.find_spec("sageattention") is not None else ())
    # The report's warnings would repeat once per install; attention_stats() keeps them for the table. The level is
    # put back afterwards: a test calls main() in its own process.
    attention_logger = logging.getLogger("invokeai.backend.attention")
    level = attention_logger.level
    attention_logger.setLevel(logging.ERROR)
    try:
        passed = measure(device, dtypes, calls, settings, rounds)
    finally:
        attention_logger.setLevel(level)
    return 1 if args.strict and not all(passed) else 0


if __name__ == "__main__":
    sys.exit(main())
