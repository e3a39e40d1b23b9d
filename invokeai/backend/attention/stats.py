"""Per-call counters and the reports made so far.

Counters live in one dict per thread so that counting needs no lock on the hot path; `attention_stats` sums them.
"""

from __future__ import annotations

import threading
from typing import Any

from invokeai.backend.attention.caller import current_node_type

Route = Any  # an SDPBackend, SAGE or GUARDED_MATH (see routing)

thread_local = threading.local()
_thread_counts: list[dict[tuple[str, Route], int]] = []
_registry_lock = threading.Lock()

reports: list[dict[str, str]] = []
# (node type, serving route, reason) already reported in this installation.
reported_keys: set[tuple[str, Route, str]] = set()
events: list[dict[str, str]] = []


def counts_for_this_thread() -> dict[tuple[str, Route], int]:
    counts: dict[tuple[str, Route], int] = {}
    with _registry_lock:
        _thread_counts.append(counts)
    thread_local.counts = counts
    return counts


def count(route: Route) -> None:
    """Count one completed call under (current node type, the kernel that served it)."""
    try:
        counts = thread_local.counts
    except AttributeError:
        counts = counts_for_this_thread()
    key = (current_node_type(), route)
    counts[key] = counts.get(key, 0) + 1


def route_name(route: Route) -> str:
    return str(route)


def call_counts() -> dict[str, dict[str, int]]:
    """{node type: {serving kernel: calls}}."""
    merged: dict[str, dict[str, int]] = {}
    with _registry_lock:
        snapshot = [dict(counts) for counts in _thread_counts]
    for counts in snapshot:
        for (node, route), calls in counts.items():
            per_node = merged.setdefault(node, {})
            name = route_name(route)
            per_node[name] = per_node.get(name, 0) + calls
    return merged


def reset() -> None:
    with _registry_lock:
        for counts in _thread_counts:
            counts.clear()
    reports.clear()
    reported_keys.clear()
    events.clear()
