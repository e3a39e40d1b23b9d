"""What the attention package tells: per-call counts, the reports and events so far, and `attention_stats()`.

Calls are counted in the running node type's tally (`caller`), without a lock; `attention_stats` reads them.
The records are plain dataclasses (this package needs torch alone); their attribute docstrings are their field
descriptions, which pydantic reads when the API serves them (`__pydantic_config__`), so the REST schema is this
record, field for field.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend.attention.caller import calls_counted, current_node_type, current_tally, tallies
from invokeai.backend.attention.kernel_probe import KernelProbe
from invokeai.backend.attention.layer import Route
from invokeai.backend.attention.routing import route_name
from invokeai.backend.attention.state import STATE

_DESCRIBED = {"use_attribute_docstrings": True}

ReportReason = Literal["cannot_serve", "unavailable", "demoted", "window", "rocm_guard", "cudnn_guard"]
EventName = Literal["cudnn_demoted", "sage_disabled"]


@dataclass(frozen=True)
class AttentionReport:
    """One "attention_backend '...' is not possible" report: made once per (node type, pinned, serving, reason)."""

    __pydantic_config__ = _DESCRIBED

    node_type: str
    """The node type whose attention call it was ("(no node)" outside any node)."""
    pinned: str
    """The pinned kernel (PyTorch's name, e.g. EFFICIENT_ATTENTION); for a cudnn_guard report, CUDNN_ATTENTION, the
    kernel the guard kept the call from, pinned or not."""
    serving: str
    """The kernel that served the call instead."""
    reason: ReportReason
    """Why the pinned kernel did not serve it (docs/attention.md lists each reason)."""
    message: str
    """The WARNING logged for it, word for word."""


@dataclass(frozen=True)
class AttentionEvent:
    """A change the package made at run time: cuDNN demoted after a failure, or SageAttention switched off."""

    __pydantic_config__ = _DESCRIBED

    event: EventName
    """What happened."""
    node_type: str
    """The node type whose attention call failed."""
    error: str
    """The first line of the error that caused it."""


# --- Measured autotuning (attention_autotune; autotune.py) ---------------------------------------------------------

AutotuneStatus = Literal["off", "on", "pinned"]
MaskKind = Literal["none", "bool", "additive", "causal"]
TunedSource = Literal["measured", "file", "order"]


@dataclass(frozen=True)
class TunedBucket:
    """The calls one tuned choice is for: every 4-D call on the device with this dtype, head size, heads, mask kind
    and grouped-query layout whose lengths round up to these powers of two."""

    __pydantic_config__ = _DESCRIBED

    device: str
    """The device the calls run on, e.g. cuda:0 or cpu."""
    dtype: str
    """The query's dtype, e.g. bfloat16."""
    head_dim: int
    """The head size."""
    query_len: int
    """The query length, rounded up to a power of two: the bucket holds lengths above half of it up to it."""
    key_len: int
    """The key length, rounded up to a power of two likewise."""
    heads: int
    """The query heads per item."""
    grouped: bool
    """Whether the key has fewer heads than the query (grouped-query attention)."""
    mask: MaskKind
    """none, bool (a boolean attn_mask), additive (a float attn_mask) or causal (is_causal without a mask)."""


@dataclass(frozen=True)
class KernelTiming:
    """What the autotuner measured of one kernel for a bucket."""

    __pydantic_config__ = _DESCRIBED

    kernel: str
    """The kernel (PyTorch's name, e.g. FLASH_ATTENTION)."""
    ms: float | None
    """The fastest of its timed runs, in milliseconds (after one untimed warm-up run); null when it was not timed."""
    runs: int
    """How many timed runs that is the fastest of."""
    note: str | None
    """Why it was not timed or not eligible (failed, wrong output, skipped for the budget or for memory), or null."""


@dataclass(frozen=True)
class TunedChoice:
    """The kernel the autotuner chose for one bucket, ranked first for its calls (a call it cannot serve runs on the
    installed order), and the timings it chose by."""

    __pydantic_config__ = _DESCRIBED

    bucket: TunedBucket
    """The calls the choice is for."""
    kernel: str
    """The chosen kernel: the fastest of the timed ones whose output agreed with the dispatcher's choice."""
    timings: list[KernelTiming]
    """Every kernel that could serve the bucket's first call, in the order they were timed."""
    cost_ms: float
    """Wall time the timing took, in milliseconds (0 for a choice read from the file)."""
    source: TunedSource
    """measured in this process, file (read from the autotune file of an earlier start on the same GPU, torch and
    cuDNN), or order (the timing failed: the installed order serves the bucket)."""


@dataclass(frozen=True)
class AttentionStats:
    """The attention package's state and what it has seen in this process (docs/attention.md)."""

    __pydantic_config__ = _DESCRIBED

    setting: str | None
    """The installed attention_backend setting (null before the install)."""
    installed: bool
    """Whether the patched SDPA is in place in this process."""
    device: str | None
    """The device the install probed and reports for (e.g. cuda:0, cpu); null before the install."""
    order: list[str]
    """The installed ranked kernel list, first choice first (after any cuDNN demotion); empty before the install."""
    order_reason: str | None
    """Why the install ranked the kernels in this order on this device, with the facts it rests on (e.g. sm90 with
    cuDNN newer than 9.15.0: cuDNN first, as PyTorch ranks it); null before the install."""
    ranked_for: str | None
    """The device facts the order was ranked for: the architecture and cuDNN version ("sm90, cuDNN 9.16.0"), or
    "ROCm", "XPU", "cpu", "mps"; null before the install."""
    torch_priority_order: list[str]
    """PyTorch's whole SDPA priority order as it is now (OVERRIDEABLE last; an open window shows here)."""
    layers: list[str]
    """The optional layers composed around SDPA, outermost first (cudnn_fallback, report, cudnn_guard, rocm_guard,
    sage)."""
    cudnn_demoted: bool
    """Whether a cuDNN failure demoted cuDNN behind math for the rest of the process."""
    window: str | None
    """The benchmarking window open now (the mode of the environment variable that opened it), or null."""
    probe: KernelProbe | None
    """The startup probe's answer on CUDA and XPU; null on the CPU and MPS."""
    unavailable: list[str]
    """Kernels this build or device lacks, from the build and the probe."""
    sage: str | None
    """The sageattention version in use, or null."""
    reports: list[AttentionReport]
    """Every report so far, oldest first."""
    events: list[AttentionEvent]
    """cuDNN demotions and SageAttention switched off at run time, oldest first."""
    counts: dict[str, dict[str, int]]
    """Completed attention calls: {node type: {serving kernel: calls}}; kernels are PyTorch's names, or sage."""
    counts_by_device: dict[str, dict[str, dict[str, int]]]
    """The same calls per session worker: {worker: {node type: {serving kernel: calls}}}. A worker is named by its
    device (cuda:1) or, where several share one, cpu#N; "(no worker)" holds calls made outside any worker."""
    # Measured autotuning (attention_autotune), apart from the ranking's fields above.
    autotune: AutotuneStatus = "off"
    """The attention_autotune setting in force: off; on (each bucket's first call times the kernels that can serve
    it, and the fastest serves its calls); pinned (on, but attention_backend pins a kernel, which overrides it:
    nothing is tuned)."""
    autotune_file: str | None = None
    """Where the tuned choices are kept across starts (<root>/attention_autotune.json), or null."""
    tuned: list[TunedChoice] = field(default_factory=list)
    """The tuned choices so far, one per bucket, oldest first."""


reports: list[AttentionReport] = []
# (node type, pinned, serving route, reason) already reported in this installation.
reported_keys: set[tuple[str, str, str, str]] = set()
events: list[AttentionEvent] = []


def count(route: Route) -> None:
    """Count one completed call under (current node type, the kernel that served it)."""
    tally = current_tally()
    next(tally.get(route) or tally.setdefault(route, itertools.count()))


def call_counts_by_device() -> dict[str, dict[str, dict[str, int]]]:
    """{device: {node type: {serving kernel: calls}}}, for the devices and node types that made calls."""
    merged: dict[str, dict[str, dict[str, int]]] = {}
    for (device, node), tally in tallies().items():
        for route, counter in list(tally.items()):
            per_node = merged.setdefault(device, {}).setdefault(node, {})
            name = route_name(route)
            per_node[name] = per_node.get(name, 0) + calls_counted(counter)
    return merged


def _summed(by_device: dict[str, dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    merged: dict[str, dict[str, int]] = {}
    for per_device in by_device.values():
        for node, kernels in per_device.items():
            per_node = merged.setdefault(node, {})
            for kernel, calls in kernels.items():
                per_node[kernel] = per_node.get(kernel, 0) + calls
    return merged


def record_event(event: EventName, error: BaseException) -> str:
    """Keep a run-time change for `attention_stats`; returns the error's first line, for the log message."""
    text = str(error).strip()
    first_line = text.splitlines()[0] if text else type(error).__name__
    events.append(AttentionEvent(event=event, node_type=current_node_type(), error=first_line))
    return first_line


def reset() -> None:
    for tally in tallies().values():
        tally.clear()
    reports.clear()
    reported_keys.clear()
    events.clear()


def attention_stats() -> AttentionStats:
    """The setting, the installed order and layers, the startup probe, every report and event so far, and the
    completed calls per node type and kernel, in all and per device."""
    state = STATE
    window = state.window
    ranked = state.ranking if state.installed else None
    by_device = call_counts_by_device()  # read once, so the totals are the sum of what is shown per device
    return AttentionStats(
        setting=state.setting,
        installed=state.installed,
        device=str(state.device) if state.device is not None else None,
        order=[kernel.name for kernel in state.order] if state.installed else [],
        order_reason=ranked.reason if ranked is not None else None,
        ranked_for=ranked.facts.describe() if ranked is not None else None,
        torch_priority_order=[SDPBackend(b).name for b in torch._C._get_sdp_priority_order()],
        layers=[layer.name for layer in state.layers],
        cudnn_demoted=state.cudnn_demoted,
        window=window.mode if window is not None else None,
        probe=state.probe,
        unavailable=sorted(state.unavailable),
        sage=state.sage.version if state.sage is not None else None,
        reports=list(reports),
        events=list(events),
        counts=_summed(by_device),
        counts_by_device=by_device,
        autotune=state.autotune,
        autotune_file=str(state.tuner.path) if state.tuner is not None and state.tuner.path is not None else None,
        tuned=state.tuner.records() if state.tuner is not None else [],
    )
