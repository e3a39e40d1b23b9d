"""Which node's attention is running, and where its calls are counted: context variables the session processor
sets around each node."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

NO_NODE = "(no node)"

# Completed calls of one node type: {route: counter}. `next()` on an itertools.count is one C call under the GIL,
# so threads counting into the same tally (two workers running one node type, or a context copied into another
# thread) never lose an increment and the hot path takes no lock.
Tally = dict[Any, "itertools.count[int]"]

_tallies: dict[str, Tally] = {NO_NODE: {}}
_tallies_lock = threading.Lock()

# ContextVars rather than thread-locals: worker threads start with their own empty context, and asyncio tasks
# inherit the caller's node the way a reader would expect.
_node_type: ContextVar[str] = ContextVar("invokeai_attention_node_type", default=NO_NODE)
_tally: ContextVar[Tally] = ContextVar("invokeai_attention_tally", default=_tallies[NO_NODE])

current_node_type = _node_type.get
current_tally = _tally.get


def tally_for(node_type: str) -> Tally:
    tally = _tallies.get(node_type)
    if tally is None:
        with _tallies_lock:
            tally = _tallies.setdefault(node_type, {})
    return tally


def tallies() -> dict[str, Tally]:
    """Every node type's tally so far (a snapshot of the registry; the tallies themselves are live)."""
    with _tallies_lock:
        return dict(_tallies)


def calls_counted(counter: itertools.count[int]) -> int:
    """The calls a counter has counted: its next value (itertools.count has no reader but its repr, "count(5)")."""
    return int(repr(counter)[6:-1])


@contextmanager
def attention_caller(node_type: str) -> Iterator[None]:
    """Attribute every attention call made inside the block to `node_type`."""
    token = _node_type.set(node_type)
    tally_token = _tally.set(tally_for(node_type))
    try:
        yield
    finally:
        _tally.reset(tally_token)
        _node_type.reset(token)
