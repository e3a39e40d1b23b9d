"""Fixtures for the node tests: a real images service (SQLite in memory, files in tmp_path) and node contexts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from node_support import ContextFactory

from invokeai.app.nodes import base
from invokeai.app.nodes.base import BaseInvocationOutput
from invokeai.app.nodes.graph import Graph, execution_order, prepare_node
from invokeai.app.services.images import ImageService
from invokeai.app.services.sqlite import SqliteDatabase


@pytest.fixture
def images(tmp_path: Path) -> Iterator[ImageService]:
    db = SqliteDatabase(None)
    yield ImageService(db, tmp_path / "outputs", max_upload_bytes=1_000_000)
    db.close()


@pytest.fixture
def make_context(images: ImageService) -> ContextFactory:
    return ContextFactory(images)


@pytest.fixture
def run_graph(make_context: ContextFactory) -> Callable[[Graph], dict[str, BaseInvocationOutput]]:
    """Run a graph the way the session processor does: in order, each node prepared from earlier outputs."""

    def run(graph: Graph) -> dict[str, BaseInvocationOutput]:
        outputs: dict[str, BaseInvocationOutput] = {}
        for node_id in execution_order(graph):
            node = prepare_node(graph, node_id, outputs)
            outputs[node_id] = node.invoke(make_context(node_id, node.type, graph.model_dump(mode="json")))
        return outputs

    return run


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node classes a test defines are registered in copies of the registries, gone after the test."""
    monkeypatch.setattr(base, "_INVOCATIONS", dict(base._INVOCATIONS))
    monkeypatch.setattr(base, "_OUTPUTS", dict(base._OUTPUTS))
