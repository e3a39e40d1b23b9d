"""Helpers shared by the node tests (importable by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

from PIL import Image

from invokeai.app.nodes.base import InvocationContext
from invokeai.app.nodes.graph import Graph
from invokeai.app.services.images import ImageService


class ContextFactory:
    """Makes InvocationContexts on one images service, recording progress; set `canceled` to cancel."""

    def __init__(self, images: ImageService) -> None:
        self.images = images
        self.progress: list[tuple[int, int, Image.Image | None]] = []
        self.canceled = False

    def __call__(
        self, node_id: str = "n", node_type: str = "test", graph: dict[str, Any] | None = None
    ) -> InvocationContext:
        return InvocationContext(
            queue_id="default",
            item_id=7,
            session_id="session-1",
            node_id=node_id,
            node_type=node_type,
            graph=graph if graph is not None else {"id": "g", "nodes": {}, "edges": []},
            images=self.images,
            on_progress=lambda step, total, preview: self.progress.append((step, total, preview and preview())),
            is_canceled=lambda: self.canceled,
        )


def edge(source: str, destination: str) -> dict[str, Any]:
    """An edge from "node.field" to "node.field"."""
    (source_node, source_field), (destination_node, destination_field) = source.split("."), destination.split(".")
    return {
        "source": {"node_id": source_node, "field": source_field},
        "destination": {"node_id": destination_node, "field": destination_field},
    }


def graph(nodes: dict[str, dict[str, Any]], edges: list[dict[str, Any]] | None = None) -> Graph:
    """A validated graph from {node_id: {type, ...inputs}} and edges."""
    return Graph.model_validate(
        {"id": "g", "nodes": {key: {"id": key, **node} for key, node in nodes.items()}, "edges": edges or []}
    )
