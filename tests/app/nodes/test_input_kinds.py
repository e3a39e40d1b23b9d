"""Inputs that take only a value (DIRECT) or only an edge (CONNECTION)."""

# No `from __future__ import annotations`: the node classes here are local to a fixture (see the registry tests).

from typing import Literal

import pytest
from pydantic import ValidationError

from invokeai.app.nodes.base import BaseInvocation, Input, InputField, InvocationContext
from invokeai.app.nodes.graph import Edge, Graph, GraphValidationError, substitute_field, validate_graph
from invokeai.app.nodes.primitives import IntegerInvocation, IntegerOutput


@pytest.fixture
def kinds(scratch_registry: None) -> type[BaseInvocation]:
    class Kinds(BaseInvocation):
        type: Literal["test_kinds"] = "test_kinds"
        direct: int = InputField(input=Input.DIRECT, description="only a value")
        wired: int = InputField(input=Input.CONNECTION, description="only an edge")

        def invoke(self, context: InvocationContext) -> IntegerOutput:
            return IntegerOutput(value=self.direct + self.wired)

    return Kinds


def _edge(destination_field: str) -> Edge:
    return Edge.model_validate(
        {"source": {"node_id": "i", "field": "value"}, "destination": {"node_id": "k", "field": destination_field}}
    )


def _graph(node: BaseInvocation, edges: list[Edge]) -> Graph:
    # The graph's node union was built before this test's class existed, so assemble the graph unparsed.
    return Graph.model_construct(id="g", nodes={"i": IntegerInvocation(id="i"), "k": node}, edges=edges)


def test_a_required_direct_input_is_required_at_parse_time(kinds: type[BaseInvocation]) -> None:
    with pytest.raises(ValidationError) as caught:
        kinds.model_validate({"id": "k"})
    assert ("direct",) in [error["loc"] for error in caught.value.errors()]
    schema = kinds.model_json_schema()
    assert schema["required"] == ["type", "id", "direct"]
    # The connection-only input is parsed as optional, but the schema shows no made-up default for it.
    assert schema["properties"]["wired"] == {
        "type": "integer",
        "title": "Wired",
        "description": "only an edge",
        "input": "connection",
        "orig_required": True,
    }


def test_a_direct_input_cannot_be_connected(kinds: type[BaseInvocation]) -> None:
    g = _graph(kinds(id="k", direct=1), [_edge("wired"), _edge("direct")])
    with pytest.raises(GraphValidationError, match="input 'direct' of node 'k' cannot be connected"):
        validate_graph(g)


def test_a_connection_input_cannot_be_set(kinds: type[BaseInvocation]) -> None:
    validate_graph(_graph(kinds(id="k", direct=1), [_edge("wired")]))
    g = _graph(kinds(id="k", direct=1, wired=2), [])
    with pytest.raises(GraphValidationError, match="input 'wired' takes only a connection"):
        validate_graph(g)
    with pytest.raises(GraphValidationError, match="input 'wired' takes only a connection"):
        substitute_field(_graph(kinds(id="k", direct=1), []), "k", "wired", 3)


def test_a_connection_input_must_be_connected(kinds: type[BaseInvocation]) -> None:
    with pytest.raises(GraphValidationError, match="required input 'wired' is neither set nor connected"):
        validate_graph(_graph(kinds(id="k", direct=1), []))
