"""Helpers for the queue tests (importable by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import functools
import threading
from typing import Any

from wait_support import wait_until as _wait

from invokeai.app.nodes.graph import Graph
from invokeai.app.services.events import EventBase, QueueItemStatusChangedEvent
from invokeai.app.services.queue_models import Batch


def graph(nodes: dict[str, dict[str, Any]], edges: list[tuple[str, str, str, str]] = ()) -> Graph:  # type: ignore[assignment]
    """A graph from {node_id: {type, ...inputs}} and (source node, field, destination node, field) edges."""
    return Graph.model_validate(
        {
            "nodes": {node_id: {"id": node_id, **node} for node_id, node in nodes.items()},
            "edges": [
                {"source": {"node_id": s, "field": sf}, "destination": {"node_id": d, "field": df}}
                for s, sf, d, df in edges
            ],
        }
    )


def integer_batch(value: int = 0, runs: int = 1, **fields: Any) -> Batch:
    """One `integer` node (see the scripted_integer_node fixture for what its value does)."""
    return Batch(graph=graph({"n": {"type": "integer", "value": value}}), runs=runs, **fields)


def image_batch(runs: int = 1) -> Batch:
    """blank_image (48x32) -> image_resize (24x16)."""
    return Batch(
        graph=graph(
            {
                "blank": {"type": "blank_image", "width": 48, "height": 32, "color": "#ff0000"},
                "resize": {"type": "image_resize", "width": 24, "height": 16},
            },
            [("blank", "image", "resize", "image")],
        ),
        runs=runs,
    )


wait_until = functools.partial(_wait, interval=0.005)  # events arrive on other threads


class EventRecorder:
    """An event bus listener that keeps every event, for tests to wait on and inspect."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[EventBase] = []

    def __call__(self, event: EventBase) -> None:
        with self._lock:
            self.events.append(event)

    def of_item(self, item_id: int) -> list[EventBase]:
        with self._lock:
            return [event for event in self.events if getattr(event, "item_id", None) == item_id]

    def names(self, item_id: int) -> list[str]:
        return [event.event_name for event in self.of_item(item_id)]

    def status(self, item_id: int) -> str | None:
        changes = [event for event in self.of_item(item_id) if isinstance(event, QueueItemStatusChangedEvent)]
        return changes[-1].status if changes else None

    def wait_status(self, item_id: int, *statuses: str, timeout: float = 10.0) -> str:
        return wait_until(
            lambda: self.status(item_id) if self.status(item_id) in statuses else None,
            timeout,
            f"item {item_id} to reach {statuses}",
        )

    def wait_event(self, item_id: int, name: str, timeout: float = 10.0) -> EventBase:
        return wait_until(
            lambda: next((e for e in self.of_item(item_id) if e.event_name == name), None),
            timeout,
            f"{name} of item {item_id}",
        )
