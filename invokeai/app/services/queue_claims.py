"""Which pending item a free worker claims: the models an item uses (stored with it at enqueue), and the choice
that prefers an item whose models are already on the worker's device without starving older items."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from invokeai.app.nodes.graph import Graph
from invokeai.app.services.model_records import ModelIdentifier

# An item that has waited this long is taken by the next free worker whatever its models: affinity saves a model
# load, never more than this much of an older item's wait. Documented in docs/scale.md.
AFFINITY_MAX_WAIT_S = 30.0
# How many of the next pending items (of the highest priority) a free worker looks at for one on its device.
AFFINITY_WINDOW = 100


def graph_models(graph: Graph) -> list[str]:
    """The models the graph's nodes name (batch data applied), as model tokens, sorted and each once."""
    found: set[str] = set()
    for node in graph.nodes.values():
        for name in type(node).model_fields:
            value = getattr(node, name)
            values = value if isinstance(value, (list, tuple)) else (value,)
            found.update(v.token for v in values if isinstance(v, ModelIdentifier))
    return sorted(found)


def models_column(graph: Graph) -> str:
    return json.dumps(graph_models(graph))


def read_models_column(text: object) -> frozenset[str]:
    """The stored `models`; an item stored before the column (NULL) or a damaged value counts as none."""
    if not isinstance(text, str):
        return frozenset()
    try:
        value = json.loads(text)
    except ValueError:
        return frozenset()
    return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, list) else frozenset()


@dataclass(frozen=True)
class Candidate:
    item_id: int
    models: frozenset[str]
    created_at: datetime


def choose_item(
    candidates: Sequence[Candidate], on_device: frozenset[str], now: datetime, max_wait_s: float
) -> int | None:
    """The item to claim among `candidates` (pending, in the order they run): the first, unless it has waited
    less than `max_wait_s` and a later one uses only models already on the worker's device.

    An item that uses no models has all of them on every device (running it loads nothing): it is never passed
    over for a later one."""
    if not candidates:
        return None
    head = candidates[0]
    if not on_device or (now - head.created_at).total_seconds() >= max_wait_s:
        return head.item_id
    preferred = next((c for c in candidates if c.models <= on_device), head)
    return preferred.item_id
