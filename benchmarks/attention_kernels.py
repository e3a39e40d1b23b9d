"""Every SDPA kernel alone and every `attention_backend` setting's ranked list, timed on the same calls in one run.

Per shape, each candidate is timed in interleaved rounds (every candidate once per round, so machine noise hits all
alike) after one untimed warm-up round; the table gives the median and the minimum over all timed calls, and every ratio
printed is between figures of this run:

- kernel X: PyTorch's bare SDPA inside `sdpa_kernel([X])`, X alone ("n/a" when it cannot serve the call);
- setting S: `install_attention(S)`, then `F.scaled_dot_product_attention` as a model calls it (the wrapper included),
  with the kernel PyTorch's dispatcher says serves it (`serving_kernel`) and the kernels the wrapper counted.

Columns: speedup = reference time / time (> 1 is faster than the reference: the memory-efficient kernel on CUDA, math
on the CPU, which has no memory-efficient kernel); peak MiB = on CUDA, torch.cuda.max_memory_allocated during one
call minus what was allocated before it, on the CPU "-" (PyTorch's CPU allocator is invisible to tracemalloc and a
process's peak RSS only grows; scripts/calibrate_sdpa_math_memory.py measures math in child processes instead);
priced MiB = `sdpa_score_matrix_bytes` for the call under that kernel or setting, what the model cache reserves for a
materialised score matrix; max|diff| = largest absolute difference from the math kernel's output.

The last lines check the rule "auto must be the fastest available kernel on every shape": auto's fastest call within
1.10x of the fastest single kernel's (minimum times, the estimate least disturbed by other processes on a shared
machine; the medians show the spread). `--strict` makes a FAIL the exit status.

Usage: PYTHONPATH=. python benchmarks/attention_kernels.py [--device cpu|cuda] [--quick] [--strict]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import logging
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from invokeai.backend.attention import (
    attention_stats,
    install_attention,
    sdpa_score_matrix_bytes,
    serving_kernel,
    uninstall_attention,
)

BARE = F.scaled_dot_product_attention
KERNELS = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)
SETTINGS = ("auto", "cudnn", "flash", "efficient", "math")
RULE_TOLERANCE = 1.10
ROUND_SECONDS = 0.02
MAX_CALLS_PER_ROUND = 40
MiB = 2**20


@dataclass(frozen=True)
class Shape:
    label: str
    batch: int
    heads: int
    length: int
    head_dim: int
    dtype: torch.dtype
    masked: bool = False

    def describe(self) -> str:
        mask = "additive (B, 1, 1, T) padding mask, last 10% of keys masked" if self.masked else "no mask"
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.label}: [{self.batch}, {self.heads}, {self.length}, {self.head_dim}] {dtype}, {mask}"


# Krea-2's main blocks attend over [1, 48, 4608, 128] at 1024x1024 (K/V expanded to 48 heads) and pass a
# (B, 1, 1, T) key-padding mask when the prompt is padded; [1, 24, 1024, 128] is the startup probe's shape.
CUDA_SHAPES = (
    Shape("krea2", 1, 48, 4608, 128, torch.bfloat16),
    Shape("krea2 masked", 1, 48, 4608, 128, torch.bfloat16, masked=True),
    Shape("probe", 1, 24, 1024, 128, torch.bfloat16),
)
# The same calls scaled down to what a 2-core CPU times in seconds.
CPU_SHAPES = (
    Shape("cpu", 1, 8, 1024, 64, torch.float32),
    Shape("cpu masked", 1, 8, 1024, 64, torch.float32, masked=True),
    Shape("cpu small", 2, 4, 256, 32, torch.float32),
)


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
    max_diff: float | None = None
    calls: int = 0  # timed calls per round, set from the warm-up call's duration
    stderr: list[str] = field(default_factory=list)  # what the first round wrote (PyTorch's reasons for a report)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times) * 1000

    @property
    def min_ms(self) -> float:
        return min(self.times) * 1000


def make_inputs(
    shape: Shape, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    generator = torch.Generator(device=device).manual_seed(0)
    size = (shape.batch, shape.heads, shape.length, shape.head_dim)
    q, k, v = (torch.randn(size, generator=generator, device=device, dtype=shape.dtype) for _ in range(3))
    mask = None
    if shape.masked:
        # A finite large negative, as a converted padding mask holds; -inf would give the same softmax.
        mask = torch.zeros(shape.batch, 1, 1, shape.length, device=device, dtype=shape.dtype)
        mask[..., -max(1, shape.length // 10) :] = torch.finfo(shape.dtype).min
    return q, k, v, mask


@contextlib.contextmanager
def kernel_alone(kernel: SDPBackend) -> Iterator[Callable[..., torch.Tensor]]:
    with sdpa_kernel([kernel]):
        yield BARE


@contextlib.contextmanager
def setting_installed(setting: str, device: torch.device) -> Iterator[Callable[..., torch.Tensor]]:
    install_attention(setting, device)
    try:
        # Looked up after installing, the way diffusers and transformers look it up at call time.
        yield F.scaled_dot_product_attention
    finally:
        uninstall_attention()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call(function: Callable[..., torch.Tensor], q, k, v, mask) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return function(q, k, v) if mask is None else function(q, k, v, attn_mask=mask)


def _priced(shape: Shape, device: torch.device) -> int:
    return sdpa_score_matrix_bytes(
        device=device,
        dtype=shape.dtype,
        num_heads=shape.batch * shape.heads,
        query_len=shape.length,
        key_len=shape.length,
        head_dim=shape.head_dim,
        has_attn_mask=shape.masked,
    )


def _first_sentence(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0].split(". ")[0][:100] if text else type(error).__name__


def warm_up(
    result: Result,
    function: Callable[..., torch.Tensor],
    shape: Shape,
    device: torch.device,
    inputs: tuple[torch.Tensor, ...],
    reference: torch.Tensor,
    is_setting: bool,
    calls: int,
) -> None:
    """First round: find out whether the candidate runs at all, its peak memory, pricing, serving kernel and error."""
    q, k, v, mask = inputs
    result.priced = _priced(shape, device)
    with warnings.catch_warnings():
        # PyTorch explains a refused kernel in UserWarnings; the table says "n/a".
        warnings.simplefilter("ignore")
        try:
            if is_setting:
                result.serving = str(getattr(serving_kernel(q, k, v, mask), "name", "sage"))
            else:
                result.serving = SDPBackend(torch._fused_sdp_choice(q, k, v, mask)).name
        except Exception:
            result.serving = "-"
        try:
            _sync(device)
            if device.type == "cuda":
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            started = time.perf_counter()
            out = _call(function, q, k, v, mask)
            _sync(device)
        except RuntimeError as error:
            result.available = False
            result.error = _first_sentence(error)
            return
        # Short calls get more samples per round, so that a round of every candidate lasts long enough to average
        # out scheduler noise (this is a shared machine); a first call is slow, so this errs towards fewer.
        seconds = time.perf_counter() - started
        result.calls = max(calls, min(MAX_CALLS_PER_ROUND, math.ceil(ROUND_SECONDS / max(seconds, 1e-6))))
        if device.type == "cuda":
            result.peak = torch.cuda.max_memory_allocated(device) - before
    result.max_diff = (out.float() - reference.float()).abs().max().item()


def time_calls(result: Result, function: Callable[..., torch.Tensor], device: torch.device, inputs: tuple) -> None:
    q, k, v, mask = inputs
    # One untimed call first: entering a candidate changes PyTorch's flags or reinstalls the wrapper (whose probe
    # empties the CUDA cache), and the first call after that may pay for allocations the steady state does not.
    _call(function, q, k, v, mask)
    for _ in range(result.calls):
        _sync(device)
        started = time.perf_counter()
        _call(function, q, k, v, mask)
        _sync(device)
        result.times.append(time.perf_counter() - started)


def collect_setting_stats(result: Result, timed: bool) -> None:
    """The distinct reports and, for a timed round, the kernels the wrapper counted; read before uninstalling
    (installing resets both)."""
    stats = attention_stats()
    if timed:
        for per_kernel in stats.counts.values():
            for kernel, calls in per_kernel.items():
                result.ran_on[kernel] = result.ran_on.get(kernel, 0) + calls
    for report in stats.reports:
        if report.message not in result.reports:
            result.reports.append(report.message)


def bench_shape(shape: Shape, device: torch.device, settings: tuple[str, ...], rounds: int, calls: int) -> list[Result]:
    inputs = make_inputs(shape, device)
    q, k, v, mask = inputs
    with sdpa_kernel([SDPBackend.MATH]):
        reference = _call(BARE, q, k, v, mask)
    candidates: list[tuple[Result, Callable[[], contextlib.AbstractContextManager], bool]] = []
    for kernel in KERNELS:
        candidates.append((Result(f"kernel {kernel.name}"), lambda kernel=kernel: kernel_alone(kernel), False))
    for setting in settings:
        candidates.append(
            (Result(f"setting {setting}"), lambda setting=setting: setting_installed(setting, device), True)
        )
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
                    warm_up(result, function, shape, device, inputs, reference, is_setting, calls)
                else:
                    time_calls(result, function, device, inputs)
                if is_setting:
                    collect_setting_stats(result, timed=round_index > 0)
            if round_index == 0:
                result.stderr = [line.strip() for line in captured.getvalue().splitlines() if line.strip()]
    del reference, inputs, q, k, v, mask
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return [result for result, _, _ in candidates]


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:.1f}"


def print_shape(shape: Shape, results: list[Result], reference_name: str) -> None:
    print()
    print(shape.describe())
    reference = next((r for r in results if r.name == f"kernel {reference_name}" and r.available), None)
    print(
        f"  {'candidate':26s} {'median ms':>10s} {'min ms':>9s} {'speedup':>8s} {'peak MiB':>9s} {'priced MiB':>10s} "
        f"{'max|diff|':>9s}  serving kernel (calls counted by the wrapper)"
    )
    for result in results:
        if not result.available:
            print(f"  {result.name:26s} {'n/a':>10s}  ({result.error})")
            continue
        speedup = f"{reference.median_ms / result.median_ms:.2f}x" if reference is not None else "-"
        diff = "-" if result.max_diff is None else f"{result.max_diff:.1e}"
        ran_on = ", ".join(f"{kernel} x{calls}" for kernel, calls in sorted(result.ran_on.items()))
        serving = f"{result.serving} ({ran_on})" if ran_on else result.serving
        print(
            f"  {result.name:26s} {result.median_ms:10.3f} {result.min_ms:9.3f} {speedup:>8s} {_mib(result.peak):>9s} "
            f"{_mib(result.priced):>10s} {diff:>9s}  {serving}"
        )
        for message in result.reports:
            print(f"  {'':26s} report: {message}")
        for line in result.stderr[:8]:
            print(f"  {'':26s} stderr: {line}")


def check_rule(shape: Shape, results: list[Result], device: torch.device) -> bool:
    kernels = [r for r in results if r.name.startswith("kernel ") and r.available]
    auto = next(r for r in results if r.name == "setting auto")
    if not kernels or not auto.available:
        print(f"rule on this {device.type}, {shape.label}: FAIL (auto or every single kernel could not run)")
        return False
    # Minimum times: other processes only ever add time, so on a shared machine the fastest of many calls is the
    # steadiest estimate of what a kernel costs (the medians above show the spread).
    fastest = min(kernels, key=lambda r: r.min_ms)
    ratio = auto.min_ms / fastest.min_ms
    passed = ratio <= RULE_TOLERANCE
    print(
        f"rule on this {device.type}, {shape.label}: auto min {auto.min_ms:.3f} ms vs fastest single kernel "
        f"{fastest.name.removeprefix('kernel ')} min {fastest.min_ms:.3f} ms = {ratio:.2f}x "
        f"(<= {RULE_TOLERANCE:.2f}x) {'PASS' if passed else 'FAIL'}"
    )
    return passed


def environment(device: torch.device) -> str:
    if device.type == "cuda":
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return (
            f"cuda ({torch.cuda.get_device_name(device)}, sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
            f", CUDA {torch.version.cuda}, cuDNN {cudnn})"
        )
    return f"cpu ({torch.get_num_threads()} threads)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--rounds", type=int, help="timed rounds (default 12, quick 4)")
    parser.add_argument(
        "--calls", type=int, help="least timed calls per candidate per round (default 2; more for short calls)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when the auto rule fails on a shape")
    args = parser.parse_args()
    # Many short rounds rather than few long ones: a burst of another process's work then lands on every candidate.
    rounds = args.rounds or (4 if args.quick else 12)
    calls = args.calls or 2
    device = torch.device(args.device)
    shapes = CUDA_SHAPES if device.type == "cuda" else CPU_SHAPES
    settings = SETTINGS + (("sage",) if importlib.util.find_spec("sageattention") is not None else ())
    reference_name = "EFFICIENT_ATTENTION" if device.type == "cuda" else "MATH"
    # The report's warnings would repeat once per install; attention_stats() keeps them for the table.
    logging.getLogger("invokeai.backend.attention").setLevel(logging.ERROR)
    uninstall_attention()

    print(f"attention kernels: torch {torch.__version__}, {environment(device)}")
    print(
        f"{rounds} timed rounds x >= {calls} calls per candidate after 1 warm-up round, interleaved; "
        f"speedup = {reference_name} time / time"
    )
    if device.type == "cpu":
        print("on the CPU PyTorch ignores the ranking (flash whenever it can serve), so every setting runs flash")
    passed: list[bool] = []
    for shape in shapes:
        results = bench_shape(shape, device, settings, rounds, calls)
        print_shape(shape, results, reference_name)
        passed.append(check_rule(shape, results, device))
    print()
    verdict = "PASS" if all(passed) else "FAIL"
    print(f"rule: on this {device.type}, auto must be the fastest available kernel on every shape: {verdict}")
    return 1 if args.strict and not all(passed) else 0


if __name__ == "__main__":
    sys.exit(main())
