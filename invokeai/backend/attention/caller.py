"""Which node's attention is running: a context variable the session processor sets around each node."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

NO_NODE = "(no node)"

# A ContextVar rather than a thread-local: worker threads start with their own empty context, and asyncio tasks
# inherit the caller's node the way a reader would expect.
_node_type: ContextVar[str] = ContextVar("invokeai_attention_node_type", default=NO_NODE)

current_node_type = _node_type.get


@contextmanager
def attention_caller(node_type: str) -> Iterator[None]:
    """Attribute every attention call made inside the block to `node_type`."""
    token = _node_type.set(node_type)
    try:
        yield
    finally:
        _node_type.reset(token)
