"""Which node's attention is running, on which worker's device, and where its calls are counted: context variables
the session processor sets around each node. Counts are kept per (device, node type), so that a process with
several workers can tell their calls apart; the totals per node type add them up."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

NO_NODE = "(no node)"
NO_DEVICE = "(no worker)"  # calls made outside any session worker (a test, a benchmark, a script)

# Completed calls of one node type: {route: counter}. `next()` on an itertools.count is one C call under the GIL,
# so threads counting into the same tally (two workers running one node type, or a context copied into another
# thread) never lose an increment and the hot path takes no lock.
Tally = dict[Any, "itertools.count[int]"]

_tallies: dict[tuple[str, str], Tally] = {(NO_DEVICE, NO_NODE): {}}
_tallies_lock = threading.Lock()

# ContextVars rather than thread-locals: worker threads start with their own empty context, and asyncio tasks
# inherit the caller's node the way a reader would expect.
_node_type: ContextVar[str] = ContextVar("invokeai_attention_node_type", default=NO_NODE)
_device: ContextVar[str] = ContextVar("invokeai_attention_device", default=NO_DEVICE)
_tally: ContextVar[Tally] = ContextVar("invokeai_attention_tally", default=_tallies[(NO_DEVICE, NO_NODE)])

current_node_type = _node_type.get
current_device = _device.get
current_tally = _tally.get


def tally_for(node_type: str, device: str = NO_DEVICE) -> Tally:
    key = (device, node_type)
    tally = _tallies.get(key)
    if tally is None:
        with _tallies_lock:
            tally = _tallies.setdefault(key, {})
    return tally


def tallies() -> dict[tuple[str, str], Tally]:
    """Every (device, node type) tally so far (a snapshot of the registry; the tallies themselves are live)."""
    with _tallies_lock:
        return dict(_tallies)


def calls_counted(counter: itertools.count[int]) -> int:
    """The calls a counter has counted: its next value (itertools.count has no reader but its repr, "count(5)")."""
    return int(repr(counter)[6:-1])


@contextmanager
def attention_caller(node_type: str, device: str | None = None) -> Iterator[None]:
    """Attribute every attention call made inside the block to `node_type`, on `device` (the session worker's
    name, e.g. cuda:1 or cpu#0; by default the enclosing block's device, else NO_DEVICE)."""
    device = _device.get() if device is None else device
    token = _node_type.set(node_type)
    device_token = _device.set(device)
    tally_token = _tally.set(tally_for(node_type, device))
    try:
        yield
    finally:
        _tally.reset(tally_token)
        _device.reset(device_token)
        _node_type.reset(token)
