"""Measure the math SDPA kernel's memory, per score element and per call, against what the server prices it at.

The math kernel materialises the whole score matrix (batch x heads x query_len x key_len), its softmax in fp32
whatever the input dtype, and temporaries. What one call costs per score element is a property of the build and the
device, so it is measured rather than derived:

- CPU: each case runs in two fresh child processes (forked from a parent that has only imported torch) that build
  the same inputs and make the same tiny warm-up call;
  one of them then runs the math kernel at the full shape. The growth of the peak resident set (ru_maxrss of the
  attention child minus that of the baseline child) divided by the number of score elements is the figure. Torch's
  CPU allocator is invisible to tracemalloc, and a fresh process per case keeps earlier cases' freed-but-retained
  heap out of the peak.
- CUDA: one process; torch.cuda.max_memory_allocated during the call minus what was allocated before it.

The growth includes the call's output and, for 16-bit inputs, the fp32 copies of q/k/v that math makes; the shapes
are chosen so that these are small next to the score matrix, and counting them keeps the figure an upper bound.
The kernel is reached the way the server reaches it: `F.scaled_dot_product_attention` inside `sdpa_kernel([MATH])`.

A second table sets each measured growth against what `sdpa_score_matrix_bytes` prices the call at with only the
math kernel enabled, for the cases above and for calls a per-element constant does not describe: short calls with
wide heads (a text encoder's 77 tokens at head_dim 128), which are made of math's copies of q, k and v more than of
scores, and grouped-query calls, whose key and value math repeats up to the query heads. Each price must be at
least its growth (price / growth >= 1); the script exits non-zero when one is not.

Usage: PYTHONPATH=. python scripts/calibrate_sdpa_math_memory.py [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from _forked import in_forked_child
from torch.nn.attention import SDPBackend, sdpa_kernel

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MASKS = ("none", "additive", "causal")


@dataclass(frozen=True)
class Case:
    heads: int
    query_len: int
    key_len: int
    head_dim: int
    mask: str = "none"  # "none", "additive" (a (1, 1, 1, key_len) padding mask, as Krea-2 passes) or "causal"
    batch: int = 1
    # False: printed for information, left out of the maximum (a cost a per-element constant cannot model).
    priced: bool = True
    # Grouped-query calls: the key-value heads, passed as they are with enable_gqa (None: as many as `heads`).
    kv_heads: int | None = None

    @property
    def key_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def grouped(self) -> bool:
        return self.key_heads != self.heads

    @property
    def elements(self) -> int:
        return self.batch * self.heads * self.query_len * self.key_len

    def label(self, mark: bool = True) -> str:
        heads = f"{self.heads}/{self.kv_heads}" if self.grouped else f"{self.heads}"
        shape = f"[{self.batch}, {heads}, {self.query_len}x{self.key_len}, {self.head_dim}]"
        label = shape if self.mask == "none" else f"{shape} {self.mask}"
        return label if self.priced or not mark else f"{label} (*)"


# Score matrices of 8-32 M elements (tens to hundreds of MB in fp32): big enough that the score matrix dominates
# the growth, small enough for a shared 2-core machine. The one-head, 512-wide case is an SD VAE mid-block at 512x512,
# where the output and the fp32 copies of q/k/v are no longer small next to the scores.
# The unpriced case shows what a per-element constant cannot model: math materialises a causal mask once per batch
# entry, not per head (a bool and a float query x key matrix), so a causal call with one or two heads costs more
# per score element than the constant.
CPU_CASES = (
    Case(8, 1024, 1024, 64),
    Case(8, 2048, 2048, 64),
    Case(1, 4096, 4096, 512),
    Case(8, 2048, 2048, 64, mask="additive"),
    Case(8, 2048, 2048, 64, mask="causal"),
    Case(1, 4096, 4096, 64, mask="causal", priced=False),
)
CPU_QUICK_CASES = (Case(8, 1024, 1024, 64), Case(8, 2048, 2048, 64), Case(8, 2048, 2048, 64, mask="additive"))
CUDA_CASES = (
    Case(8, 1024, 1024, 128),
    Case(8, 2048, 2048, 128),
    Case(24, 4096, 4096, 128),
    Case(1, 4096, 4096, 512),
    Case(1, 16384, 16384, 512),
    Case(24, 4096, 4096, 128, mask="additive"),
    Case(24, 4096, 4096, 128, mask="causal"),
    Case(1, 16384, 16384, 128, mask="causal", priced=False),
)
CUDA_QUICK_CASES = (Case(8, 2048, 2048, 128), Case(24, 4096, 4096, 128), Case(24, 4096, 4096, 128, mask="additive"))

# Calls priced against their growth only (second table): a 77-token text encoder at head_dim 128, grouped-query
# (32 query / 8 key-value heads, as the Krea-2 text encoder passes them when unpadded, causal) and not, and one
# longer grouped call, where the scores dominate again. The growth of a call this short is a few MiB, so each is
# measured over at least SHORT_REPEATS child pairs.
CALL_CASES = (
    Case(32, 77, 77, 128, kv_heads=8),
    Case(32, 77, 77, 128, kv_heads=8, mask="causal"),
    Case(32, 77, 77, 128, kv_heads=8, mask="additive"),
    Case(32, 77, 77, 128),
    Case(32, 77, 77, 128, mask="additive"),
    Case(12, 77, 77, 64, mask="causal"),
    Case(32, 1024, 1024, 128, kv_heads=8),
)
CALL_QUICK_CASES = (Case(32, 77, 77, 128, kv_heads=8), Case(32, 77, 77, 128))
SHORT_REPEATS = 3


def make_inputs(
    case: Case, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    generator = torch.Generator(device=device).manual_seed(0)

    def tensor(heads: int, length: int) -> torch.Tensor:
        # Drawn in the target dtype on the target device: an fp32 draw converted afterwards would leave a transient
        # in the baseline child's peak RSS and hide that much of the attention call's growth.
        shape = (case.batch, heads, length, case.head_dim)
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)

    q = tensor(case.heads, case.query_len)
    k, v = tensor(case.key_heads, case.key_len), tensor(case.key_heads, case.key_len)
    mask = None
    if case.mask == "additive":
        # The last tenth of the keys is padding: a large finite negative, as a converted padding mask would be.
        mask = torch.zeros(case.batch, 1, 1, case.key_len, device=device, dtype=dtype)
        mask[..., -max(1, case.key_len // 10) :] = torch.finfo(dtype).min
    return q, k, v, mask


def run_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=q.shape[-3] != k.shape[-3]
        )


def warm_up(case: Case, dtype: torch.dtype, device: torch.device) -> None:
    """A tiny call of the case's kind: thread pools and one-time kernel buffers go into the baseline."""
    group = case.heads // case.key_heads if case.grouped else 1
    q = torch.randn(1, group, 8, case.head_dim, device=device, dtype=dtype)
    kv = torch.randn(1, 1, 8, case.head_dim, device=device, dtype=dtype)
    run_math(q, kv, kv, None, case.mask == "causal")


def _maxrss_bytes() -> int:
    # Linux reports KiB, macOS bytes.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def child_peak(case: Case, dtype_name: str, attention: bool) -> int:
    """One CPU measurement: build inputs, warm up on a tiny call, optionally run the case; return the peak RSS."""
    dtype = DTYPES[dtype_name]
    q, k, v, mask = make_inputs(case, dtype, torch.device("cpu"))
    warm_up(case, dtype, torch.device("cpu"))
    if attention:
        out = run_math(q, k, v, mask, case.mask == "causal")
        del out
    return _maxrss_bytes()


def _forked_peak(case: Case, dtype_name: str, attention: bool) -> int:
    """`child_peak` in a forked child. The parent has imported torch but run no op (so no thread pool exists to be
    broken by the fork): each child starts from the same state in milliseconds instead of a 2 s torch import."""
    return int(in_forked_child(child_peak, case, dtype_name, attention, what=f"{case.label()} {dtype_name}"))


def _spawned_peak(case: Case, dtype_name: str, attention: bool) -> int:
    """`child_peak` in a fresh interpreter, where fork is not available."""
    spec = json.dumps({"case": asdict(case), "dtype": dtype_name, "attention": attention})
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", spec], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"child for {case.label()} {dtype_name} failed: {done.stderr.strip()[-2000:]}")
    return int(done.stdout.strip().splitlines()[-1])


def measure_cpu(case: Case, dtype_name: str, repeats: int) -> int:
    """Growth in bytes; with repeats, the smallest baseline against the largest attention peak (upper bound)."""
    peak_of = _forked_peak if hasattr(os, "fork") else _spawned_peak
    baseline = min(peak_of(case, dtype_name, False) for _ in range(repeats))
    peak = max(peak_of(case, dtype_name, True) for _ in range(repeats))
    return peak - baseline


def measure_cuda(case: Case, dtype_name: str, device: torch.device) -> int:
    dtype = DTYPES[dtype_name]
    q, k, v, mask = make_inputs(case, dtype, device)
    warm_up(case, dtype, device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = run_math(q, k, v, mask, case.mask == "causal")
    torch.cuda.synchronize(device)
    growth = torch.cuda.max_memory_allocated(device) - before
    del out, q, k, v, mask
    torch.cuda.empty_cache()
    return growth


def measure(case: Case, dtype_name: str, device: torch.device, repeats: int) -> int:
    if device.type == "cuda":
        return measure_cuda(case, dtype_name, device)
    return measure_cpu(case, dtype_name, repeats)


def _current_constant(device: torch.device, dtype: torch.dtype) -> int | None:
    try:
        from invokeai.backend.attention.memory import bytes_per_score_element
    except ImportError:  # run without the repository on PYTHONPATH: measure only
        return None
    return bytes_per_score_element(device, dtype)


def price(case: Case, dtype: torch.dtype, device: torch.device) -> int | None:
    """What the server reserves for the call with only the math kernel enabled (no install: the router asks
    PyTorch's own dispatcher, which honours the flags on the CPU too); None without the repository on the path.
    Called in the parent only after its last fork: it runs torch ops."""
    try:
        from invokeai.backend.attention.memory import sdpa_score_matrix_bytes
    except ImportError:
        return None
    with sdpa_kernel([SDPBackend.MATH]):
        return sdpa_score_matrix_bytes(
            device=device,
            dtype=dtype,
            num_heads=case.batch * case.heads,
            kv_heads=case.batch * case.key_heads,
            query_len=case.query_len,
            key_len=case.key_len,
            head_dim=case.head_dim,
            has_attn_mask=case.mask == "additive",
            is_causal=case.mask == "causal",
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated subset of " + ", ".join(DTYPES))
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--repeats", type=int, default=1, help="CPU: child pairs per case")
    parser.add_argument("--margin", type=int, default=1, help="bytes added to the rounded-up maximum")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    # For the tests: a JSON list of [case fields, dtype] pairs; prints their growths (bytes) as a JSON list.
    parser.add_argument("--growth", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(child_peak(Case(**spec["case"]), spec["dtype"], spec["attention"]))
        return 0
    device = torch.device(args.device)
    if args.growth:
        specs = [(Case(**fields), dtype_name) for fields, dtype_name in json.loads(args.growth)]
        repeats = max(args.repeats, SHORT_REPEATS)
        print(json.dumps([measure(case, dtype_name, device, repeats) for case, dtype_name in specs]))
        return 0

    if device.type == "cuda":
        cases = CUDA_QUICK_CASES if args.quick else CUDA_CASES
        where = f"cuda ({torch.cuda.get_device_name(device)}), torch.cuda.max_memory_allocated growth"
    else:
        cases = CPU_QUICK_CASES if args.quick else CPU_CASES
        # Not torch.get_num_threads(): the parent must run nothing that starts a thread pool before it forks.
        where = f"cpu ({os.cpu_count()} cores), ru_maxrss growth over a baseline child process"
    calls = CALL_QUICK_CASES if args.quick else CALL_CASES
    dtype_names = [name.strip() for name in args.dtypes.split(",") if name.strip()]
    print(f"math SDPA kernel memory per score element: torch {torch.__version__}, {where}")
    print(f"{'dtype':9s} {'shape [batch, heads, q x k, head_dim] mask':48s} {'score elems':>12s} {'bytes/elem':>10s}")
    worst: dict[str, float] = {}
    growths: list[tuple[Case, str, int]] = []
    failed = 0
    for dtype_name in dtype_names:
        for case in cases:
            try:
                growth = measure(case, dtype_name, device, args.repeats)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
                print(f"{dtype_name:9s} {case.label():48s} failed: {str(error).strip().splitlines()[0]}")
                failed += 1
                continue
            per_element = growth / case.elements
            if case.priced:
                worst[dtype_name] = max(worst.get(dtype_name, 0.0), per_element)
            growths.append((case, dtype_name, growth))
            print(f"{dtype_name:9s} {case.label():48s} {case.elements:12d} {per_element:10.2f}")
    if any(not case.priced for case in cases):
        print("(*) left out of the maximum: a causal mask is materialised per batch entry, not per head")
    # Measured after the per-element cases and before any price: pricing runs torch ops in this process, and
    # every fork must come from a parent that has run none.
    for dtype_name in dtype_names:
        for case in calls:
            try:
                growths.append((case, dtype_name, measure(case, dtype_name, device, max(args.repeats, SHORT_REPEATS))))
            except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
                print(f"{dtype_name:9s} {case.label():48s} failed: {str(error).strip().splitlines()[0]}")
                failed += 1
    print()
    print(f"{'dtype':9s} {'max bytes/elem':>14s} {'suggested (ceil + margin)':>26s} {'current constant':>17s}")
    for dtype_name, value in worst.items():
        suggested = math.ceil(value) + args.margin
        current = _current_constant(device, DTYPES[dtype_name])
        verdict = "-" if current is None else f"{current} ({'covers' if current >= value else 'TOO LOW'})"
        print(f"{dtype_name:9s} {value:14.2f} {suggested:26d} {verdict:>17s}")
    print()
    print("growth against the price (sdpa_score_matrix_bytes, only the math kernel enabled), MiB:")
    header = f"{'shape [batch, q/kv heads, q x k, head_dim] mask':48s} {'growth':>9s} {'price':>9s}"
    print(f"{'dtype':9s} {header} {'ratio':>6s}")
    short = 0
    for case, dtype_name, growth in growths:
        priced = price(case, DTYPES[dtype_name], device)
        if priced is None:
            print(f"{dtype_name:9s} {case.label(mark=False):48s} {growth / 2**20:9.2f} {'-':>9s} {'-':>6s}")
            continue
        ratio = priced / growth if growth > 0 else math.inf
        short += ratio < 1
        flag = "" if ratio >= 1 else "  TOO LOW"
        figures = f"{growth / 2**20:9.2f} {priced / 2**20:9.2f} {ratio:6.2f}"
        print(f"{dtype_name:9s} {case.label(mark=False):48s} {figures}{flag}")
    if short:
        print(f"{short} call(s) priced below their growth")
    return 1 if failed or short else 0


if __name__ == "__main__":
    sys.exit(main())
