"""execution_order, prepare_node and substitute_field: what the session processor and batches rely on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from node_support import edge, graph

from invokeai.app.nodes.base import BaseInvocationOutput
from invokeai.app.nodes.graph import Graph, GraphValidationError, execution_order, prepare_node, substitute_field
from invokeai.app.nodes.image import ImageOutput
from invokeai.app.nodes.primitives import FloatInvocation, FloatOutput, IntegerOutput, RandomIntInvocation

RunGraph = Callable[[Graph], dict[str, BaseInvocationOutput]]


def test_order_puts_every_node_after_its_sources_and_is_deterministic() -> None:
    g = graph(
        {
            "late": {"type": "float"},
            "mid": {"type": "float"},
            "first": {"type": "integer", "value": 2},
            "free": {"type": "string"},
        },
        [edge("first.value", "mid.value"), edge("mid.value", "late.value")],
    )
    order = execution_order(g)
    assert order == ["first", "mid", "late", "free"]
    assert all(execution_order(g) == order for _ in range(5))


def test_order_with_no_edges_is_the_listed_order() -> None:
    g = graph({name: {"type": "integer"} for name in ("c", "a", "b")})
    assert execution_order(g) == ["c", "a", "b"]


def test_order_refuses_a_cycle() -> None:
    g = graph(
        {"a": {"type": "float"}, "b": {"type": "float"}}, [edge("a.value", "b.value"), edge("b.value", "a.value")]
    )
    with pytest.raises(GraphValidationError, match="cycle"):
        execution_order(g)


def test_prepare_node_copies_connected_outputs_into_inputs() -> None:
    g = graph({"i": {"type": "integer", "value": 3}, "f": {"type": "float"}}, [edge("i.value", "f.value")])
    prepared = prepare_node(g, "f", {"i": IntegerOutput(value=3)})
    assert isinstance(prepared, FloatInvocation)
    assert prepared.value == 3.0 and isinstance(prepared.value, float)
    # The graph's own node is untouched: the next run of the same graph starts from what was sent.
    assert "value" not in g.nodes["f"].model_fields_set


def test_prepare_node_gives_a_copy_of_the_output() -> None:
    g = graph(
        {"a": {"type": "blank_image"}, "r": {"type": "image_resize"}},
        [edge("a.image", "r.image")],
    )
    output = ImageOutput(image={"image_name": "0" * 32 + ".png"}, width=1, height=1)
    prepared = prepare_node(g, "r", {"a": output})
    prepared.image.image_name = "changed"
    assert output.image.image_name == "0" * 32 + ".png"


def test_prepare_node_keeps_values_set_in_the_graph() -> None:
    g = graph({"r": {"type": "rand_int", "low": 5, "high": 9, "seed": 4}})
    prepared = prepare_node(g, "r", {})
    assert isinstance(prepared, RandomIntInvocation)
    assert (prepared.low, prepared.high, prepared.seed) == (5, 9, 4)


def test_prepare_node_needs_the_source_to_have_run() -> None:
    g = graph({"i": {"type": "integer"}, "f": {"type": "float"}}, [edge("i.value", "f.value")])
    with pytest.raises(GraphValidationError, match=r"needs the output of node 'i', which has not run"):
        prepare_node(g, "f", {})


def test_prepare_node_validates_values_that_arrive_by_edge() -> None:
    # An integer 0 is type-compatible with blank_image's width but breaks its ge=1 constraint.
    g = graph({"i": {"type": "integer", "value": 0}, "b": {"type": "blank_image"}}, [edge("i.value", "b.width")])
    with pytest.raises(GraphValidationError, match=r"node 'b' \(blank_image\): width: Input should be greater"):
        prepare_node(g, "b", {"i": IntegerOutput(value=0)})


def test_prepare_node_refuses_a_missing_required_input() -> None:
    # A graph that skipped validate_graph: the processor still gets a clear error instead of a None image.
    g = graph({"r": {"type": "image_resize"}})
    with pytest.raises(GraphValidationError, match="required input 'image' is neither set nor connected"):
        prepare_node(g, "r", {})


def test_prepare_node_unknown_node() -> None:
    with pytest.raises(GraphValidationError, match="'nope' is not in the graph"):
        prepare_node(graph({}), "nope", {})


def test_run_through_a_graph_copies_values_along(run_graph: RunGraph) -> None:
    g = graph(
        {
            "seed": {"type": "integer", "value": 11},
            "rand": {"type": "rand_int", "low": 1, "high": 1000},
            "f": {"type": "float"},
        },
        [edge("seed.value", "rand.seed"), edge("rand.value", "f.value")],
    )
    outputs = run_graph(g)
    assert isinstance(outputs["f"], FloatOutput)
    assert outputs["f"].value == float(outputs["rand"].value)  # type: ignore[attr-defined]
    assert run_graph(g)["rand"] == outputs["rand"]


def test_substitute_field_returns_a_validated_copy() -> None:
    g = graph({"a": {"type": "blank_image", "width": 8}, "r": {"type": "image_resize"}}, [edge("a.image", "r.image")])
    changed = substitute_field(g, "a", "width", 64)
    assert changed.nodes["a"].width == 64  # type: ignore[attr-defined]
    assert g.nodes["a"].width == 8  # type: ignore[attr-defined]
    assert changed.edges == g.edges
    assert "image" not in changed.nodes["r"].model_fields_set
    # Lax like the API: a float that is a whole number is an int, as it would be in a request body.
    assert substitute_field(g, "a", "height", 16.0).nodes["a"].height == 16  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("node_id", "field", "value", "expected"),
    [
        ("x", "width", 3, "node 'x' is not in the graph"),
        ("a", "depth", 3, "node 'a' (blank_image) has no input 'depth'"),
        ("a", "id", "b", "has no input 'id'"),
        ("a", "type", "integer", "has no input 'type'"),
        ("a", "width", "wide", "node 'a' (blank_image): width: Input should be a valid integer"),
        ("a", "width", -1, "node 'a' (blank_image): width: Input should be greater than or equal to 1"),
        ("a", "color", "blue", "node 'a' (blank_image): color: Value error, a color is an object"),
        ("r", "image", {"image_name": "x"}, "input 'image' is fed by edge a.image -> r.image"),
    ],
)
def test_substitute_field_refusals(node_id: str, field: str, value: Any, expected: str) -> None:
    g = graph({"a": {"type": "blank_image", "width": 8}, "r": {"type": "image_resize"}}, [edge("a.image", "r.image")])
    with pytest.raises(GraphValidationError) as caught:
        substitute_field(g, node_id, field, value)
    assert expected in str(caught.value)
    assert caught.value.node_id == node_id
