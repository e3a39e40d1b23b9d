"""validate_graph: each way a parsed graph can still be unable to run, named in the error."""

from __future__ import annotations

from typing import Any

import pytest
from node_support import edge, graph

from invokeai.app.nodes.graph import Graph, GraphValidationError, validate_graph

BLANK = {"type": "blank_image", "width": 8, "height": 8}
RESIZE = {"type": "image_resize", "width": 4, "height": 4}


def refused(g: Graph) -> GraphValidationError:
    with pytest.raises(GraphValidationError) as caught:
        validate_graph(g)
    return caught.value


def test_a_valid_graph_passes() -> None:
    validate_graph(graph({"a": BLANK, "b": RESIZE}, [edge("a.image", "b.image")]))
    validate_graph(graph({}))


def test_node_key_must_equal_node_id() -> None:
    g = Graph.model_validate({"id": "g", "nodes": {"a": {"id": "b", "type": "integer"}}})
    error = refused(g)
    assert error.node_id == "a"
    assert "'a'" in str(error) and "'b'" in str(error)


def test_required_input_neither_set_nor_connected() -> None:
    error = refused(graph({"r": RESIZE}))
    assert error.node_id == "r"
    assert "required input 'image' is neither set nor connected" in str(error)


def test_required_input_set_directly_is_enough() -> None:
    validate_graph(graph({"r": {**RESIZE, "image": {"image_name": "0" * 32 + ".png"}}}))


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ([edge("x.image", "b.image")], "source node 'x' is not in the graph"),
        ([edge("a.image", "x.image")], "destination node 'x' is not in the graph"),
        ([edge("a.picture", "b.image")], "node 'a' (blank_image) has no output 'picture'"),
        ([edge("a.image", "b.picture")], "node 'b' (image_resize) has no input 'picture'"),
        # `id` and `type` are node fields, not inputs; outputs are not inputs either.
        ([edge("a.image", "b.id")], "has no input 'id'"),
        ([edge("a.width", "b.type")], "has no input 'type'"),
        ([edge("a.type", "b.width")], "has no output 'type'"),
    ],
)
def test_edge_to_a_missing_node_or_field(edges: list[dict[str, Any]], expected: str) -> None:
    error = refused(graph({"a": BLANK, "b": {**RESIZE, "image": {"image_name": "x"}}}, edges))
    assert expected in str(error)
    assert error.edge is not None
    assert str(error.edge) in str(error)


@pytest.mark.parametrize(
    ("source", "destination", "ok"),
    [
        ("i.value", "f.value", True),  # int into float
        ("f.value", "i.value", False),
        ("s.value", "i.value", False),
        ("b.value", "i.value", False),  # bool is not a number here
        ("i.value", "s.value", False),
        ("blank.image", "resize.image", True),
        ("i.value", "resize.image", False),
        ("blank.width", "resize.width", True),
        ("f.value", "blend.alpha", True),
        ("i.value", "blend.alpha", True),
        ("blank.image", "blend.alpha", False),
    ],
)
def test_edge_types(source: str, destination: str, ok: bool) -> None:
    g = graph(
        {
            "i": {"type": "integer", "value": 1},
            "f": {"type": "float", "value": 1.0},
            "s": {"type": "string", "value": "x"},
            "b": {"type": "boolean", "value": True},
            "blank": BLANK,
            "resize": {**RESIZE, "image": {"image_name": "x"}},
            "blend": {"type": "image_blend", "image_a": {"image_name": "x"}, "image_b": {"image_name": "y"}},
        },
        [edge(source, destination)],
    )
    if ok:
        validate_graph(g)
    else:
        error = refused(g)
        assert "does not fit input type" in str(error)
        assert f"{source} -> {destination}" in str(error)


def test_two_edges_into_one_input() -> None:
    g = graph({"a": BLANK, "c": BLANK, "b": RESIZE}, [edge("a.image", "b.image"), edge("c.image", "b.image")])
    error = refused(g)
    assert "c.image -> b.image" in str(error)
    assert "already fed by edge a.image -> b.image" in str(error)


def test_the_same_edge_twice_is_two_edges_into_one_input() -> None:
    g = graph({"a": BLANK, "b": RESIZE}, [edge("a.image", "b.image"), edge("a.image", "b.image")])
    assert "already fed" in str(refused(g))


def test_cycle() -> None:
    g = graph({"a": RESIZE, "b": RESIZE}, [edge("a.image", "b.image"), edge("b.image", "a.image")])
    error = refused(g)
    assert "cycle" in str(error)
    assert "the graph has a cycle: 'a' -> 'b' -> 'a'" in str(error)
    assert error.node_id == "a"


def test_cycle_is_named_even_behind_other_nodes() -> None:
    # 'head' feeds the cycle c1 -> c2 -> c3 -> c1 and 'tail' hangs off it; only the loop is reported.
    g = graph(
        {
            "head": BLANK,
            "tail": RESIZE,
            "c1": {"type": "image_blend"},
            "c2": RESIZE,
            "c3": RESIZE,
        },
        [
            edge("head.image", "c1.image_a"),
            edge("c3.image", "c1.image_b"),
            edge("c1.image", "c2.image"),
            edge("c2.image", "c3.image"),
            edge("c3.image", "tail.image"),
        ],
    )
    message = str(refused(g))
    assert "'c1' -> 'c2' -> 'c3' -> 'c1'" in message
    assert "head" not in message and "tail" not in message


def test_self_loop() -> None:
    g = graph({"a": {"type": "image_blend", "image_a": {"image_name": "x"}}}, [edge("a.image", "a.image_b")])
    assert "cycle: 'a' -> 'a'" in str(refused(g))
