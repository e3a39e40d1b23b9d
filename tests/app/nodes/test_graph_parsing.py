"""Parsing a graph: the node union, what pydantic refuses (naming the node), and connected inputs left out."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError
from web_server import LOCAL_BASE_URL

from invokeai.app.nodes.graph import Graph, validate_graph
from invokeai.app.nodes.image import ImageResizeInvocation

RESIZE_FED_BY_BLANK: dict[str, Any] = {
    "id": "g1",
    "nodes": {
        "a": {"id": "a", "type": "blank_image", "width": 48, "height": 32, "color": "#ff0000"},
        "b": {"id": "b", "type": "image_resize", "width": 24, "height": 16},
    },
    "edges": [{"source": {"node_id": "a", "field": "image"}, "destination": {"node_id": "b", "field": "image"}}],
}


def _errors(data: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as caught:
        Graph.model_validate(data)
    return caught.value.errors()


def test_a_connected_required_input_may_be_left_out() -> None:
    graph = Graph.model_validate(RESIZE_FED_BY_BLANK)
    resize = graph.nodes["b"]
    assert isinstance(resize, ImageResizeInvocation)
    assert "image" not in resize.model_fields_set
    validate_graph(graph)
    # Dumped, the graph reads like the one that was sent: no null for the unset input.
    assert "image" not in graph.model_dump(mode="json")["nodes"]["b"]


def test_unknown_node_type_names_the_node() -> None:
    errors = _errors({"id": "g", "nodes": {"x": {"id": "x", "type": "no_such_node"}}})
    assert errors[0]["loc"] == ("nodes", "x")
    assert errors[0]["type"] == "union_tag_invalid"


def test_missing_node_type_names_the_node() -> None:
    errors = _errors({"id": "g", "nodes": {"x": {"id": "x", "width": 3}}})
    assert errors[0]["loc"] == ("nodes", "x")


@pytest.mark.parametrize(
    ("node", "field"),
    [
        ({"id": "n", "type": "integer", "value": "abc"}, "value"),
        ({"id": "n", "type": "blank_image", "width": "wide"}, "width"),
        ({"id": "n", "type": "blank_image", "width": 0}, "width"),
        ({"id": "n", "type": "blank_image", "color": "red"}, "color"),
        ({"id": "n", "type": "image_resize", "image": "not-an-object"}, "image"),
        ({"id": "n", "type": "image_resize", "image": None}, "image"),
        ({"id": "n", "type": "image_blend", "image_a": {"image_name": "x"}, "alpha": 1.5}, "alpha"),
    ],
)
def test_wrong_value_type_names_the_node_and_field(node: dict[str, Any], field: str) -> None:
    errors = _errors({"id": "g", "nodes": {"n": node}})
    assert errors[0]["loc"][:2] == ("nodes", "n")
    assert errors[0]["loc"][3] == field


def test_unknown_input_name_is_refused() -> None:
    errors = _errors({"id": "g", "nodes": {"n": {"id": "n", "type": "integer", "valeu": 3}}})
    assert errors[0]["loc"] == ("nodes", "n", "integer", "valeu")
    assert errors[0]["type"] == "extra_forbidden"


def test_openapi_shows_the_real_types_and_every_node() -> None:
    app = FastAPI()

    @app.post("/graph")
    def accept(graph: Graph) -> Graph:
        return graph

    schema = app.openapi()["components"]["schemas"]
    resize = schema["ImageResizeInvocation"]
    # The connectable required input keeps its real type, has no fake default, and says it is required.
    assert resize["properties"]["image"]["$ref"].endswith("/ImageField")
    assert "default" not in resize["properties"]["image"]
    assert resize["properties"]["image"]["orig_required"] is True
    assert resize["required"] == ["type", "id"]
    assert resize["properties"]["width"]["type"] == "integer"
    for name in ("BlankImageInvocation", "ImageBlendInvocation", "IntegerInvocation", "RandomIntInvocation"):
        assert name in schema
    client = TestClient(app, base_url=LOCAL_BASE_URL)
    assert client.post("/graph", json=RESIZE_FED_BY_BLANK).status_code == 200
    refused = client.post("/graph", json={"id": "g", "nodes": {"q": {"id": "q", "type": "nope"}}})
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "nodes", "q"]
