"""The invocation cache through the real app: a node with use_cache runs once for the same inputs, what it names in
the tensor store outlives its item while cached, and /api/v1/app/invocation_cache reports and controls it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from api_support import MakeClient, edge, enqueue, graph_json, node, wait_finished
from fastapi.testclient import TestClient

from invokeai.app.nodes.base import InvocationContext
from invokeai.app.nodes.primitives import StringInvocation, StringOutput

CACHE = "/api/v1/app/invocation_cache"
# Three cheap nodes with use_cache (InvokeAI's default): integer -> float, and a string.
CHEAP = graph_json(
    node("i", "integer", value=3),
    node("f", "float"),
    node("s", "string", value="a prompt"),
    edges=[edge("i", "value", "f", "value")],
)


def run(client: TestClient, graph: dict[str, Any], **batch: Any) -> dict[str, Any]:
    response = enqueue(client, graph, **batch)
    assert response.status_code == 200, response.text
    [item_id] = response.json()["item_ids"]
    item = wait_finished(client, item_id)
    assert item["status"] == "completed", item
    return item


def status(client: TestClient) -> dict[str, Any]:
    response = client.get(f"{CACHE}/status")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_a_second_identical_run_takes_its_outputs_from_the_cache(
    client: TestClient, scripted_integer_node: list[str]
) -> None:
    assert status(client) == {"size": 0, "hits": 0, "misses": 0, "enabled": True, "max_size": 512, "pinned_bytes": 0}
    first = run(client, CHEAP)
    assert len(scripted_integer_node) == 1
    assert {k: status(client)[k] for k in ("size", "hits", "misses")} == {"size": 3, "hits": 0, "misses": 3}
    second = run(client, CHEAP)
    assert len(scripted_integer_node) == 1  # the integer node did not run again
    assert {k: status(client)[k] for k in ("size", "hits", "misses")} == {"size": 3, "hits": 3, "misses": 3}
    assert second["session"]["results"] == first["session"]["results"]
    # Another value is another key; the node's id is not part of it.
    renamed = graph_json(node("other-id", "integer", value=3))
    run(client, renamed)
    run(client, graph_json(node("i", "integer", value=4)))
    assert len(scripted_integer_node) == 2 and status(client)["hits"] == 4


def test_image_nodes_and_nodes_without_use_cache_run_every_time(
    client: TestClient, scripted_integer_node: list[str]
) -> None:
    graph = graph_json(node("blank", "blank_image", width=8, height=8), node("i", "integer", value=1, use_cache=False))
    first, second = run(client, graph), run(client, graph)
    assert len(scripted_integer_node) == 2
    names = [item["session"]["results"]["blank"]["image"]["image_name"] for item in (first, second)]
    assert names[0] != names[1]  # each run made an image of its own
    assert status(client)["size"] == 0


def test_rand_int_is_not_cached_unless_the_graph_asks(client: TestClient) -> None:
    run(client, graph_json(node("r", "rand_int", seed=5)))
    run(client, graph_json(node("r", "rand_int", seed=5)))
    assert {k: status(client)[k] for k in ("size", "hits", "misses")} == {"size": 0, "hits": 0, "misses": 0}
    run(client, graph_json(node("r", "rand_int", seed=5, use_cache=True)))
    run(client, graph_json(node("r", "rand_int", seed=5, use_cache=True)))
    assert {k: status(client)[k] for k in ("size", "hits", "misses")} == {"size": 1, "hits": 1, "misses": 1}


def test_node_cache_size_bounds_the_cache(make_client: MakeClient) -> None:
    client = make_client(node_cache_size=2)
    run(client, graph_json(*(node(f"n{value}", "integer", value=value) for value in range(5))))
    assert {k: status(client)[k] for k in ("size", "max_size", "misses")} == {"size": 2, "max_size": 2, "misses": 5}


def test_node_cache_size_0_turns_it_off(make_client: MakeClient, scripted_integer_node: list[str]) -> None:
    client = make_client(node_cache_size=0)
    assert client.put(f"{CACHE}/enable").status_code == 200
    run(client, CHEAP)
    run(client, CHEAP)
    assert len(scripted_integer_node) == 2
    assert status(client) == {"size": 0, "hits": 0, "misses": 0, "enabled": False, "max_size": 0, "pinned_bytes": 0}


def test_disable_enable_and_clear(client: TestClient, scripted_integer_node: list[str]) -> None:
    run(client, CHEAP)
    response = client.put(f"{CACHE}/disable")
    assert (response.status_code, response.json()) == (200, None)
    run(client, CHEAP)
    assert len(scripted_integer_node) == 2 and status(client)["enabled"] is False
    assert client.put(f"{CACHE}/enable").status_code == 200
    run(client, CHEAP)
    assert len(scripted_integer_node) == 2 and status(client)["hits"] == 3  # what it held was kept
    response = client.delete(CACHE)
    assert (response.status_code, response.json()) == (200, None)
    assert {k: status(client)[k] for k in ("size", "hits", "misses")} == {"size": 0, "hits": 0, "misses": 0}
    run(client, CHEAP)
    assert len(scripted_integer_node) == 3


@pytest.fixture
def tensor_string_node(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The `string` node made to pass a tensor: node "make" saves one (as the item's own, as every node that makes
    tensors does) and outputs its name; node "use" loads the tensor its input names and outputs its sum. Returns
    the names "make" saved, one per run."""
    made: list[str] = []

    def invoke(self: StringInvocation, context: InvocationContext) -> StringOutput:
        if context.node_id == "make":
            name = context.tensors.save(torch.full((4,), float(len(self.value))), owner=context.session_id)
            made.append(name)
            return StringOutput(value=name)
        return StringOutput(value=f"sum {float(context.tensors.load(self.value).sum())}")

    StringInvocation.output_class()
    monkeypatch.setattr(StringInvocation, "invoke", invoke)
    return made


def tensor_graph(text: str) -> dict[str, Any]:
    return graph_json(
        node("make", "string", value=text),
        node("use", "string", use_cache=False),
        edges=[edge("make", "value", "use", "value")],
    )


def test_a_cached_output_names_tensors_that_outlive_their_item(
    make_client: MakeClient, tensor_string_node: list[str]
) -> None:
    client = make_client(node_cache_size=1)
    tensors = client.app.state.services.tensors  # type: ignore[attr-defined]
    first = run(client, tensor_graph("abc"))
    [name] = tensor_string_node
    assert name in tensors and tensors.pinned_bytes == 16  # its item ended, its cached output still names it
    second = run(client, tensor_graph("abc"))
    assert tensor_string_node == [name]  # "make" came from the cache, and "use" could load what it names
    assert second["session"]["results"]["use"]["value"] == first["session"]["results"]["use"]["value"] == "sum 12.0"
    run(client, tensor_graph("abcd"))  # a new output takes the cache's one place: the first tensor goes
    assert name not in tensors and len(tensor_string_node) == 2 and tensor_string_node[1] in tensors
    assert client.delete(CACHE).status_code == 200
    assert tensors.total_bytes == 0 and tensors.pinned_bytes == 0
