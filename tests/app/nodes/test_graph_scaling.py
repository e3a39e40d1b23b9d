"""Validation costs time linear in nodes plus edges, a long cycle gets a bounded message, and the node-count
limit (max_graph_nodes) answers 422 through the API before any validation.

The time bounds are loose on purpose (a loaded 2-core machine): the old per-node scan of every fed input took
about 14 s for 16,000 nodes, and these graphs validate in well under a tenth of a second."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from web_server import LOCAL_BASE_URL

from invokeai.app.api.app_factory import create_app
from invokeai.app.config import InvokeAIAppConfig
from invokeai.app.nodes.graph import Graph, GraphValidationError, validate_graph

QUEUE = "/api/v1/queue/default"


def chain(nodes: int, cycle: bool) -> dict[str, Any]:
    """image_resize nodes, each feeding the next; closed into a cycle, or with the first node given its image."""
    graph_nodes = {f"n{i}": {"id": f"n{i}", "type": "image_resize", "width": 8, "height": 8} for i in range(nodes)}
    if not cycle:
        graph_nodes["n0"]["image"] = {"image_name": "start.png"}
    edges = [
        {"source": {"node_id": f"n{i}", "field": "image"}, "destination": {"node_id": f"n{j}", "field": "image"}}
        for i, j in ((i, (i + 1) % nodes) for i in range(nodes if cycle else nodes - 1))
    ]
    return {"id": "g", "nodes": graph_nodes, "edges": edges}


def test_a_20k_node_chain_validates_in_linear_time() -> None:
    graph = Graph.model_validate(chain(20_000, cycle=False))
    start = time.process_time()
    validated = validate_graph(graph)
    took = time.process_time() - start
    assert validated.order == tuple(f"n{i}" for i in range(20_000))
    assert took < 3.0, f"{took:.1f} s"


def test_a_20k_node_cycle_is_refused_in_linear_time_with_a_bounded_message() -> None:
    graph = Graph.model_validate(chain(20_000, cycle=True))
    start = time.process_time()
    with pytest.raises(GraphValidationError) as caught:
        validate_graph(graph)
    took = time.process_time() - start
    assert took < 3.0, f"{took:.1f} s"
    message = str(caught.value)
    # The first and the last nodes of the loop are named; the other 19,980 are counted, not listed.
    assert message.startswith("the graph has a cycle: 'n0' -> 'n1' -> ")
    assert "(19981 more nodes)" in message and message.endswith("'n19998' -> 'n19999' -> 'n0'")
    assert len(message) < 500
    assert caught.value.node_id == "n0"


def test_a_short_cycle_is_named_whole() -> None:
    with pytest.raises(GraphValidationError) as caught:
        validate_graph(Graph.model_validate(chain(20, cycle=True)))
    assert str(caught.value) == "the graph has a cycle: " + " -> ".join(repr(f"n{i}") for i in [*range(20), 0])


def client_with(tmp_path: Path, **settings: Any) -> TestClient:
    config = InvokeAIAppConfig.located({"use_memory_db": True, **settings}, tmp_path, None)
    return TestClient(create_app(config, run_processor=False), base_url=LOCAL_BASE_URL)


def test_max_graph_nodes_refuses_a_larger_graph_with_422(tmp_path: Path) -> None:
    nodes = {f"f{i}": {"id": f"f{i}", "type": "float", "value": 1.0} for i in range(6)}
    with client_with(tmp_path, max_graph_nodes=5) as client:
        assert client.get("/api/v1/app/config").json()["config"]["max_graph_nodes"] == 5
        over = client.post(f"{QUEUE}/enqueue_batch", json={"batch": {"graph": {"nodes": nodes}}})
        assert over.status_code == 422, over.text
        (detail,) = over.json()["detail"]
        assert detail["loc"] == ["body", "batch", "graph", "nodes"]
        assert detail["type"] == "graph_too_large"
        assert "6 nodes" in detail["msg"] and "at most 5" in detail["msg"] and "max_graph_nodes" in detail["msg"]
        nodes.pop("f5")
        at = client.post(f"{QUEUE}/enqueue_batch", json={"batch": {"graph": {"nodes": nodes}}})
        assert at.status_code == 200, at.text
        assert client.get(f"{QUEUE}/status").json()["queue"]["pending"] == 1


def test_a_16k_node_cycle_is_refused_through_the_api_in_seconds(tmp_path: Path) -> None:
    # Below the default limit it would be refused for its size; raised, the cycle itself must be found fast.
    with client_with(tmp_path, max_graph_nodes=20_000) as client:
        start = time.perf_counter()
        answer = client.post(f"{QUEUE}/enqueue_batch", json={"batch": {"graph": chain(16_000, cycle=True)}})
        took = time.perf_counter() - start
        assert answer.status_code == 422, answer.text[:300]
        (detail,) = answer.json()["detail"]
        assert detail["type"] == "graph_invalid" and "cycle" in detail["msg"]
        assert took < 8.0, f"{took:.1f} s"
