"""Measured autotuning (`attention_autotune: on`): the first call of each shape bucket times every kernel that can
serve it, and the fastest is ranked first for the bucket's later calls.

A bucket is the device, dtype, head size, query heads, grouped-query or not, mask kind (none, bool, additive,
causal) and the query and key lengths rounded up to powers of two (`TunedBucket`). Only 4-D calls without dropout,
outside autograd, are tuned; the others keep the installed order.

Timing. The kernels are those of the installed order that can serve the bucket's first call (PyTorch's own
eligibility checks, `devices.kernel_can_serve`; on the CPU, which has no such checks, the dispatcher's choice and
math), minus any another layer keeps from the call (the cuDNN guard). The dispatcher's choice runs through
PyTorch's SDPA, as it would serve the call; every other kernel through its aten operator (`kernels.py`), as it
will serve the call if chosen: never by switching PyTorch's flags, which are process-global. Each gets one untimed
warm-up run (cuDNN builds its plan there), then up to REPEATS timed runs, each bracketed by a device synchronize;
its figure is the fastest run. A bucket's timing stops starting runs once BUDGET_MS is spent (each kernel timed so
far keeps its figure; the rest are skipped and say so), math is not timed where its score matrix would pass
MATH_LIMIT_BYTES (memory no estimate reserved), and the cost is logged. A kernel whose warm-up output differs from
the dispatcher's choice's beyond the dtype's tolerance (`TOLERANCE`), or that fails, is not chosen. The tuning
runs are a side computation: the call itself is then served as any later call of the bucket is.

Serving. The choice is ranked first for its bucket, with set-priority semantics: the router's reroute sends a call
to it when PyTorch's check says it can serve that call and no other layer keeps it from it; otherwise the call runs
on the dispatcher's choice under the installed order. A cuDNN choice that fails at run time is demoted by the cuDNN
fallback as any cuDNN call is, and is not used again.

Threads. A bucket is timed once: the first thread to reach it claims it (a claim per bucket, under one lock), and a
call of another thread that reaches the bucket meanwhile runs on the installed order without waiting, rather than
stalling a worker for up to the budget.

Persistence. Every choice is kept in the autotune file (<root>/attention_autotune.json,
`settings.AUTOTUNE_FILE_NAME`) under the device's name, the torch version and the cuDNN version; a later start with
the same three reads the choice on the bucket's first call instead of timing it. An unreadable, corrupt or foreign
file is ignored with a WARNING (never a failed start) and replaced at the next save.

A pin (`attention_backend` other than auto or sage) overrides tuning: nothing is tuned. The working-memory estimate
prices the tuned kernel (`Autotune.price`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict
from pathlib import Path
from typing import Any, get_args

import torch
import torch.nn.functional as F

from invokeai.backend import devices
from invokeai.backend.attention import kernels, stats
from invokeai.backend.attention.layer import Call, Layer, Rebuild, Reroute
from invokeai.backend.attention.memory import PricedCall, bytes_per_score_element
from invokeai.backend.attention.state import AttentionState
from invokeai.backend.attention.stats import KernelTiming, MaskKind, TunedBucket, TunedChoice

logger = logging.getLogger(__name__)

FILE_FORMAT = 1
REPEATS = 3
BUDGET_MS = 200.0
# Math materialises its score matrix: past this much, timing it could run out of memory the working-memory
# estimate did not reserve (it priced the dispatcher's fused choice), and math would not win there anyway.
MATH_LIMIT_BYTES = 256 << 20
# How far a kernel's output may be from the dispatcher's choice's, relative to the output's largest magnitude
# (at least 1): the fused kernels' own spread against math (fp32 1e-6, bf16 ~1e-2), with room.
TOLERANCE: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}
DEFAULT_TOLERANCE = 1e-2
CUDNN = "CUDNN_ATTENTION"
MATH = "MATH"
KNOWN_KERNELS = frozenset({"FLASH_ATTENTION", "EFFICIENT_ATTENTION", CUDNN, MATH, "OVERRIDEABLE"})

# (device, dtype, head_dim, query_len, key_len, heads, grouped, mask kind): cheap to build and hash per call.
BucketKey = tuple[torch.device, torch.dtype, int, int, int, int, bool, str]
# (kernel, device, run) -> (the run's output, seconds it took). Tests stand in a clock that returns fixed times.
Timer = Callable[[str, torch.device, Callable[[], torch.Tensor]], tuple[torch.Tensor, float]]


def wall_clock(kernel: str, device: torch.device, run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    """The run's wall time, the device synchronized before and after (kernels launch asynchronously)."""
    synchronize = _synchronizer(device)
    synchronize()
    started = time.perf_counter()
    out = run()
    synchronize()
    return out, time.perf_counter() - started


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "xpu":
        return lambda: torch.xpu.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None


# The seam tests replace (before install_attention, which captures it) to time with a stand-in clock.
measure: Timer = wall_clock


def bucket_length(length: int) -> int:
    """The power of two a length rounds up to: 77 -> 128, 4096 -> 4096, 4608 -> 8192."""
    return 1 << max(0, length - 1).bit_length()


def mask_kind(attn_mask: torch.Tensor | None, is_causal: bool) -> MaskKind:
    if attn_mask is None:
        return "causal" if is_causal else "none"
    return "bool" if attn_mask.dtype == torch.bool else "additive"


def bucket_record(key: BucketKey) -> TunedBucket:
    device, dtype, head_dim, query_len, key_len, heads, grouped, mask = key
    return TunedBucket(
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        head_dim=head_dim,
        query_len=query_len,
        key_len=key_len,
        heads=heads,
        grouped=grouped,
        mask=mask,  # type: ignore[arg-type]
    )


def describe_bucket(bucket: TunedBucket) -> str:
    """For the log: "cuda:0 bfloat16, head_dim 128, 24 heads, query <=8192, key <=8192, no mask"."""
    heads = f"{bucket.heads} heads" + (", grouped-query" if bucket.grouped else "")
    mask = {"none": "no mask", "causal": "causal"}.get(bucket.mask, f"{bucket.mask} mask")
    return (
        f"{bucket.device} {bucket.dtype}, head_dim {bucket.head_dim}, {heads}, query <={bucket.query_len}, "
        f"key <={bucket.key_len}, {mask}"
    )


# --- The machine a choice was measured on --------------------------------------------------------------------------


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device) -> str:
    """The device's model as its vendor names it; a CPU's with the threads torch uses, which its timings turn on."""
    try:
        if device.type == "cuda":
            return torch.cuda.get_device_name(device)
        if device.type == "xpu":
            return torch.xpu.get_device_name(device)
    except Exception:  # a name is a label: never a reason to fail a call
        return device.type
    if device.type == "cpu":
        return f"{_cpu_name()} ({torch.get_num_threads()} threads)"
    return device.type


def machine(device: torch.device) -> dict[str, str | None]:
    """What the file keys a device's choices by: its name, the torch version, the cuDNN version (null off CUDA)."""
    cudnn = None
    if device.type == "cuda" and torch.version.hip is None:
        try:
            cudnn = str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None
        except Exception:
            cudnn = None
    return {"device": device_name(device), "torch": torch.__version__, "cudnn": cudnn}


def machine_key(facts: dict[str, str | None]) -> str:
    return f"{facts['device']} | torch {facts['torch']} | cuDNN {facts['cudnn'] or 'none'}"


# --- The autotune file ---------------------------------------------------------------------------------------------

_BUCKET_FIELDS = {"dtype": str, "head_dim": int, "query_len": int, "key_len": int, "heads": int, "grouped": bool}
_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (torch.float32, torch.float16, torch.bfloat16)}


class FileError(ValueError):
    """The autotune file is not one this version wrote."""


def _persisted_bucket(record: TunedBucket) -> dict[str, Any]:
    """A bucket as the file keeps it: without the device, which the file's key names."""
    data = asdict(record)
    del data["device"]
    return data


def _read_choice(data: Any) -> tuple[tuple[Any, ...], TunedChoice]:
    """(the bucket's key without the device, the choice with a stand-in device) from one entry of the file."""
    if not isinstance(data, dict):
        raise FileError("a choice is not a mapping")
    bucket = data.get("bucket")
    if not isinstance(bucket, dict) or set(bucket) != {*_BUCKET_FIELDS, "mask"}:
        raise FileError(f"a choice's bucket is not one this version writes: {bucket!r}")
    for name, kind in _BUCKET_FIELDS.items():
        if type(bucket[name]) is not kind:
            raise FileError(f"a bucket's {name} is {bucket[name]!r}")
    if bucket["dtype"] not in _DTYPES or bucket["mask"] not in get_args(MaskKind):
        raise FileError(f"a bucket's dtype or mask is unknown: {bucket['dtype']!r}, {bucket['mask']!r}")
    kernel = data.get("kernel")
    if kernel not in KNOWN_KERNELS:
        raise FileError(f"a choice's kernel is {kernel!r}")
    timings = []
    for timing in data.get("timings") or []:
        if not isinstance(timing, dict) or timing.get("kernel") not in KNOWN_KERNELS:
            raise FileError(f"a timing is {timing!r}")
        ms, runs, note = timing.get("ms"), timing.get("runs", 0), timing.get("note")
        if not (ms is None or isinstance(ms, (int, float))) or not isinstance(runs, int):
            raise FileError(f"a timing is {timing!r}")
        timings.append(KernelTiming(timing["kernel"], None if ms is None else float(ms), runs, note))
    record = TunedBucket(device="", **bucket)
    partial = tuple(bucket[name] for name in (*_BUCKET_FIELDS, "mask"))
    return partial, TunedChoice(bucket=record, kernel=kernel, timings=timings, cost_ms=0.0, source="file")


def _partial_key(key: BucketKey) -> tuple[Any, ...]:
    _, dtype, head_dim, query_len, key_len, heads, grouped, mask = key
    return (str(dtype).removeprefix("torch."), head_dim, query_len, key_len, heads, grouped, mask)


class TuningFile:
    """The autotune file: {"format": 1, "machines": {key: {"device", "torch", "cudnn", "choices": [...]}}}.

    Read once, when tuning is installed; written whole (atomically) after each new measured choice, keeping the
    choices of other machines (a root on shared storage may serve several kinds of GPU)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.machines: dict[str, dict[str, Any]] = {}
        self._parsed: dict[str, dict[tuple[Any, ...], TunedChoice]] = {}
        self._lock = threading.Lock()
        self._warned_write = False
        self._warned_foreign: set[str] = set()
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as error:
            logger.warning(
                "attention_autotune: cannot read %s (%s); it is ignored, and every bucket is timed", path, error
            )
            return
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
                raise FileError(f"not an autotune file of format {FILE_FORMAT}")
            machines = data.get("machines")
            if not isinstance(machines, dict):
                raise FileError("no machines mapping")
            parsed = {}
            for key, entry in machines.items():
                if not isinstance(entry, dict) or not isinstance(entry.get("choices"), list):
                    raise FileError(f"the entry for {key!r} has no list of choices")
                parsed[key] = dict(_read_choice(choice) for choice in entry["choices"])
        except (ValueError, TypeError) as error:  # json.JSONDecodeError and FileError are ValueErrors
            logger.warning(
                "attention_autotune: %s is not an autotune file this version can read (%s); it is ignored, every "
                "bucket is timed again, and it is replaced at the next save",
                path,
                error,
            )
            return
        self.machines = machines
        self._parsed = parsed

    def choices_for(self, key: str) -> dict[tuple[Any, ...], TunedChoice]:
        """The file's choices for a machine; a WARNING, once, where the file holds only other machines'."""
        found = self._parsed.get(key)
        if found is None and self._parsed and key not in self._warned_foreign:
            self._warned_foreign.add(key)
            logger.warning(
                "attention_autotune: %s holds choices for %s, not for %s: they are not used here, and this device "
                "is timed anew",
                self.path,
                "; ".join(sorted(self._parsed)),
                key,
            )
        return found or {}

    def save(self, key: str, facts: dict[str, str | None], choices: list[TunedChoice]) -> None:
        """This machine's choices written over its entry; the file replaced atomically. A root that cannot be written
        is a WARNING, once: tuning goes on in memory."""
        if self.path is None:
            return
        entry = {**facts, "choices": [self._entry(choice) for choice in choices]}
        with self._lock:
            self.machines[key] = entry
            data = {"format": FILE_FORMAT, "machines": self.machines}
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                temporary.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
                os.replace(temporary, self.path)
            except OSError as error:
                with contextlib.suppress(OSError):
                    temporary.unlink(missing_ok=True)
                if not self._warned_write:
                    self._warned_write = True
                    logger.warning(
                        "attention_autotune: cannot write %s (%s); choices are kept in memory only", self.path, error
                    )

    @staticmethod
    def _entry(choice: TunedChoice) -> dict[str, Any]:
        return {
            "bucket": _persisted_bucket(choice.bucket),
            "kernel": choice.kernel,
            "timings": [asdict(timing) for timing in choice.timings],
        }


# --- Routes --------------------------------------------------------------------------------------------------------


class _Tuned(str):
    """A call sent to the bucket's tuned kernel, which the dispatcher did not choose. It is the kernel's name (so it
    is counted, reported and priced as that kernel, and the cuDNN fallback catches a tuned cuDNN's failure), and
    it carries the kernel's run."""

    run: Call

    def __new__(cls, kernel: str, run: Call) -> _Tuned:
        route = super().__new__(cls, kernel)
        route.run = run
        return route

    def __repr__(self) -> str:
        return f"TUNED_{str.__str__(self)}"


TUNED: dict[str, _Tuned] = {name: _Tuned(name, run) for name, run in kernels.RUNS.items()}


class _Untuned:
    """The first call of a bucket with no choice yet: served as the dispatcher chose (its name reads so to
    `serving_kernel` and the pricing), after the autotune layer has timed the bucket."""

    __slots__ = ("chosen", "key")

    def __init__(self, chosen: str, key: BucketKey) -> None:
        self.chosen = chosen
        self.key = key

    def __str__(self) -> str:
        return self.chosen

    def __repr__(self) -> str:
        return f"UNTUNED_{self.chosen}"


# --- The tuner -----------------------------------------------------------------------------------------------------

Eligible = Callable[..., bool]  # (kernel, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> bool


class Tuner:
    """The tuned choices of one installation, the claims of the buckets being timed, and the file."""

    def __init__(
        self,
        state: AttentionState,
        path: str | Path | None = None,
        *,
        timer: Timer | None = None,
        repeats: int = REPEATS,
        budget_ms: float = BUDGET_MS,
    ) -> None:
        self.state = state
        self.path = Path(path) if path is not None else None
        self.file = TuningFile(self.path)
        self.timer = timer if timer is not None else measure
        self.repeats = repeats
        self.budget_ms = budget_ms
        self.choices: dict[BucketKey, TunedChoice] = {}
        self.tuning: set[BucketKey] = set()
        self._lock = threading.Lock()
        self._machines: dict[torch.device, tuple[str, dict[str, str | None]]] = {}
        self._from_file: dict[torch.device, dict[tuple[Any, ...], TunedChoice]] = {}

    # Lookups --------------------------------------------------------------------------------------------------------

    def _machine(self, device: torch.device) -> tuple[str, dict[str, str | None]]:
        found = self._machines.get(device)
        if found is None:
            facts = machine(device)
            found = self._machines[device] = (machine_key(facts), facts)
        return found

    def lookup(self, key: BucketKey) -> TunedChoice | None:
        """The bucket's choice: tuned in this process, or read from the file for this device's machine (adopted on
        first use, so the file is matched once per bucket)."""
        choice = self.choices.get(key)
        if choice is not None:
            return choice
        device = key[0]
        from_file = self._from_file.get(device)
        if from_file is None:
            from_file = self._from_file[device] = self.file.choices_for(self._machine(device)[0])
        stored = from_file.get(_partial_key(key))
        if stored is None:
            return None
        choice = TunedChoice(
            bucket=bucket_record(key), kernel=stored.kernel, timings=stored.timings, cost_ms=0.0, source="file"
        )
        with self._lock:
            return self.choices.setdefault(key, choice)

    def records(self) -> list[TunedChoice]:
        with self._lock:
            return list(self.choices.values())

    # Timing ---------------------------------------------------------------------------------------------------------

    def tune(
        self,
        route: _Untuned,
        eligible: Eligible,
        original: Callable[..., torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        m: torch.Tensor | None,
        c: bool,
        s: float | None,
        g: bool,
    ) -> None:
        """Time the bucket of this call, once: a bucket another thread has claimed, or that has a choice, is left
        alone. Never raises for a kernel's failure, and always leaves a choice (the dispatcher's on a failure), so
        the bucket is never timed twice."""
        key = route.key
        with self._lock:
            if key in self.choices or key in self.tuning:
                return
            self.tuning.add(key)
        choice: TunedChoice | None = None
        try:
            choice = self.lookup(key)
            if choice is None:
                choice = self._measure(key, route.chosen, eligible, original, q, k, v, m, c, s, g)
        except Exception as error:  # a defect here must not fail the generation: the order serves the bucket
            logger.warning(
                "attention_autotune: timing %s failed (%s); the installed order serves it",
                describe_bucket(bucket_record(key)),
                error,
            )
            choice = TunedChoice(bucket_record(key), route.chosen, [], 0.0, "order")
        finally:
            with self._lock:
                if choice is not None:
                    self.choices.setdefault(key, choice)
                self.tuning.discard(key)
        if choice.source == "measured":
            self._save(key[0])

    def _save(self, device: torch.device) -> None:
        name, facts = self._machine(device)
        mine = [choice for key, choice in list(self.choices.items()) if key[0] == device and choice.source != "order"]
        # Choices of this machine read from the file but not used in this process stay in it.
        kept = {_partial_key_of(choice.bucket): choice for choice in self.file.choices_for(name).values()}
        kept.update({_partial_key_of(choice.bucket): choice for choice in mine})
        self.file.save(name, facts, list(kept.values()))

    def _candidates(
        self,
        chosen: str,
        eligible: Eligible,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        m,
        c,
        s,
        g,  # type: ignore[no-untyped-def]
    ) -> list[str]:
        """The dispatcher's choice first, then every other kernel of the installed order that can serve the call."""
        names = [chosen]
        for kernel in self.state.order:
            name = kernel.name
            if name != chosen and eligible(name, q, k, v, m, 0.0, c, s, g):
                names.append(name)
        return names

    def _measure(
        self,
        key: BucketKey,
        chosen: str,
        eligible: Eligible,
        original: Callable[..., torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        m: torch.Tensor | None,
        c: bool,
        s: float | None,
        g: bool,
    ) -> TunedChoice:
        bucket = bucket_record(key)
        device = q.device
        budget = self.budget_ms / 1000
        scale = 1.0  # the reference output's largest magnitude, at least 1: the tolerance is relative to it
        tolerance = TOLERANCE.get(q.dtype, DEFAULT_TOLERANCE)
        math_bytes = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * bytes_per_score_element(device, q.dtype)
        reference: torch.Tensor | None = None
        timings: list[KernelTiming] = []
        best: tuple[float, str] | None = None
        spent = 0.0
        started = time.perf_counter()
        for name in self._candidates(chosen, eligible, q, k, v, m, c, s, g):
            if spent >= budget and best is not None:
                timings.append(
                    KernelTiming(name, None, 0, f"skipped: the bucket's {self.budget_ms:g} ms budget was spent")
                )
                continue
            if name == MATH and name != chosen and math_bytes > MATH_LIMIT_BYTES:
                timings.append(
                    KernelTiming(name, None, 0, f"skipped: its score matrix would take {math_bytes / 2**20:.0f} MiB")
                )
                continue
            if name == chosen:
                run: Callable[[], torch.Tensor] = lambda: original(q, k, v, m, 0.0, c, scale=s, enable_gqa=g)  # noqa: E731
            else:
                runner = kernels.RUNS[name]
                run = lambda runner=runner: runner(q, k, v, m, 0.0, c, s, g)  # type: ignore[misc]  # noqa: E731
            try:
                out, seconds = self.timer(name, device, run)  # the warm-up: plans, caches, the output check
                spent += seconds
                if reference is None:
                    reference = out
                    scale = max(1.0, float(reference.detach().abs().float().nan_to_num().max()))
                elif not _agrees(out, reference, tolerance * scale):
                    timings.append(
                        KernelTiming(name, None, 0, "not chosen: its output differs from the dispatcher's choice's")
                    )
                    continue
                del out
                runs = []
                for _ in range(self.repeats):
                    _, seconds = self.timer(name, device, run)
                    spent += seconds
                    runs.append(seconds)
                    if spent >= budget:
                        break
            except Exception as error:  # this kernel cannot serve the bucket after all: it is not chosen
                text = str(error).strip().splitlines()
                timings.append(KernelTiming(name, None, 0, f"failed: {text[0] if text else type(error).__name__}"))
                continue
            fastest = min(runs)
            timings.append(KernelTiming(name, round(fastest * 1000, 4), len(runs), None))
            if best is None or fastest < best[0]:
                best = (fastest, name)
        cost_ms = (time.perf_counter() - started) * 1000
        kernel = best[1] if best is not None else chosen
        choice = TunedChoice(bucket, kernel, timings, round(cost_ms, 3), "measured" if best is not None else "order")
        logger.info(
            "attention_autotune: %s: %s; chosen %s (timing took %.1f ms)",
            describe_bucket(bucket),
            ", ".join(_timing_text(timing) for timing in timings),
            kernel,
            cost_ms,
        )
        return choice


def _partial_key_of(bucket: TunedBucket) -> tuple[Any, ...]:
    return (bucket.dtype, bucket.head_dim, bucket.query_len, bucket.key_len, bucket.heads, bucket.grouped, bucket.mask)


def _timing_text(timing: KernelTiming) -> str:
    if timing.ms is None:
        return f"{timing.kernel} ({timing.note})"
    return f"{timing.kernel} {timing.ms:.3f} ms"


def _agrees(out: torch.Tensor, reference: torch.Tensor, tolerance: float) -> bool:
    """Within `tolerance` everywhere, NaN where the reference has NaN (fully masked rows) and nowhere else."""
    if out.shape != reference.shape:
        return False
    out, reference = out.detach().float(), reference.detach().float()
    if not torch.equal(out.isnan(), reference.isnan()):
        return False
    difference = (out - reference).nan_to_num(nan=0.0).abs().max()
    return bool(difference <= tolerance) and not math.isnan(float(difference))


# --- The layer -----------------------------------------------------------------------------------------------------


def bucket_key(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> BucketKey:
    return (
        q.device,
        q.dtype,
        q.shape[3],
        bucket_length(q.shape[2]),
        bucket_length(k.shape[2]),
        q.shape[1],
        k.shape[1] != q.shape[1],
        mask_kind(attn_mask, is_causal),
    )


# Set while the estimate asks the router about its small probe call: that call's own bucket (lengths capped at 64)
# is not the priced call's, so its tuned choice must not answer for it (`Autotune.price` looks up the right one).
_pricing: ContextVar[bool] = ContextVar("invokeai_attention_autotune_pricing", default=False)


class Autotune(Layer):
    name = "autotune"

    def active(self, state: AttentionState) -> bool:
        return state.tuner is not None

    def _eligible(self, state: AttentionState) -> Eligible:
        """Whether a kernel can serve a call through its own run: on this device, by PyTorch's check, not a demoted
        cuDNN, and not kept from the call by another layer's reroute (the cuDNN guard)."""
        can_serve = devices.kernel_can_serve
        others = [reroute for layer in state.layers if layer is not self and (reroute := layer.reroute(state))]

        def eligible(kernel, q, k, v, m, d, c, s, g) -> bool:  # type: ignore[no-untyped-def]
            if not kernels.runs_on(kernel, q) or (kernel == CUDNN and state.cudnn_demoted):
                return False
            try:
                if not can_serve(kernel, q, k, v, m, d, c, g):
                    return False
            except Exception:  # a device PyTorch's checks do not know (XPU, MPS): only what runs everywhere
                return kernel == MATH
            return all(other(kernel, q, k, v, m, d, c, s, g) is None for other in others)

        return eligible

    def reroute(self, state: AttentionState) -> Reroute | None:
        tuner = state.tuner
        assert tuner is not None
        choices, tuning, lookup = tuner.choices, tuner.tuning, tuner.lookup
        eligible = self._eligible(state)
        grad_enabled = torch.is_grad_enabled
        pricing = _pricing.get

        def tuned(chosen, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
            if d or state.window is not None or q.dim() != 4 or k.dim() != 4 or q.is_nested or pricing():
                return None
            if grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                return None
            key = bucket_key(q, k, m, c)
            choice = choices.get(key) or lookup(key)
            if choice is None:
                return None if key in tuning else _Untuned(chosen, key)
            kernel = choice.kernel
            if kernel == chosen or not eligible(kernel, q, k, v, m, d, c, s, g):
                return None  # set-priority: where the tuned kernel cannot serve, the installed order does
            return TUNED[kernel]

        return tuned

    def wrap(self, state: AttentionState, inner: Call, rebuild: Rebuild) -> Call:
        tuner = state.tuner
        assert tuner is not None and state.original_sdpa is not None
        count = stats.count
        eligible = self._eligible(state)
        original = state.original_sdpa
        installation = state.installation

        def autotuned(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
            kind = route.__class__
            if kind is _Tuned:
                out = route.run(q, k, v, m, d, c, s, g)
                count(route)
                return out
            if kind is _Untuned:
                tuner.tune(route, eligible, original, q, k, v, m, c, s, g)
                # Served as a later call of the bucket is: routed anew, through every layer, and counted once.
                again = state.public if state.installation == installation else None
                return (again or F.scaled_dot_product_attention)(q, k, v, m, d, c, scale=s, enable_gqa=g)
            return inner(route, q, k, v, m, d, c, s, g)

        return autotuned

    def price(self, state: AttentionState, call: PricedCall, inner: Callable[[], int]) -> int:
        """The tuned kernel's price: math's bytes where math was chosen; nothing where a fused kernel was chosen and
        can serve the call; otherwise what the installed order's kernel costs."""
        tuner = state.tuner
        assert tuner is not None
        choice = _priced_choice(tuner, call)
        if choice is not None and choice.kernel == MATH:
            return call.math_bytes()
        if choice is not None and self._eligible(state)(choice.kernel, *call.probe_arguments()):
            return 0
        token = _pricing.set(True)
        try:
            return inner()
        finally:
            _pricing.reset(token)


def _priced_choice(tuner: Tuner, call: PricedCall) -> TunedChoice | None:
    """The choice for the bucket an estimator's call falls in. Estimators say only whether a call has a mask, so a
    masked call looks up the additive bucket, then the bool one."""
    batch = call.batch if call.num_heads % call.batch == 0 and call.kv_heads % call.batch == 0 else 1
    heads, kv_heads = call.num_heads // batch, call.kv_heads // batch
    masks = ("additive", "bool") if call.has_attn_mask else ("causal",) if call.is_causal else ("none",)
    device = devices.canonical_device(call.device)
    for mask in masks:
        key = (
            device,
            call.dtype,
            call.head_dim,
            bucket_length(call.query_len),
            bucket_length(call.key_len),
            heads,
            kv_heads != heads,
            mask,
        )
        choice = tuner.lookup(key)
        if choice is not None:
            return choice
    return None
