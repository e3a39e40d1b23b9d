"""Batches expanded into graphs: data zipped within a group, groups combined as a product, each graph validated."""

from __future__ import annotations

import time
from typing import Any

import pytest
from queue_support import graph

from invokeai.app.services.batch import InvalidBatchError, expand_batch, item_count
from invokeai.app.services.queue_models import Batch, BatchDatum


def datum(node: str, field: str, items: list[Any]) -> BatchDatum:
    return BatchDatum(node_path=node, field_name=field, items=items)


THREE_INTEGERS = graph({"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}})


def values(batch: Batch) -> list[dict[str, Any]]:
    return [{f"{v.node_path}.{v.field_name}": v.value for v in session.field_values} for session in expand_batch(batch)]


def test_without_data_one_graph_is_validated_and_runs_are_not_repeated() -> None:
    batch = Batch(graph=THREE_INTEGERS, runs=3)
    sessions = expand_batch(batch)
    assert len(sessions) == 1 and sessions[0].field_values == []
    assert sessions[0].graph == THREE_INTEGERS
    assert item_count(batch) == 3


def test_data_is_zipped_within_a_group_and_multiplied_across_groups() -> None:
    batch = Batch(
        graph=THREE_INTEGERS,
        runs=2,
        data=[[datum("a", "value", [1, 2]), datum("b", "value", [10, 20])], [datum("c", "value", [7, 8, 9])]],
    )
    assert values(batch) == [
        {"a.value": a, "b.value": b, "c.value": c} for a, b in [(1, 10), (2, 20)] for c in (7, 8, 9)
    ]
    assert item_count(batch) == 2 * 2 * 3
    first = expand_batch(batch)[0].graph
    assert (first.nodes["a"].value, first.nodes["b"].value, first.nodes["c"].value) == (1, 10, 7)
    assert THREE_INTEGERS.nodes["a"].value == 0  # the batch's own graph is left as it was


def test_data_may_fill_a_required_input_the_graph_leaves_unset() -> None:
    resize = graph({"r": {"type": "image_resize", "width": 8, "height": 8}})
    batch = Batch(graph=resize, data=[[datum("r", "image", [{"image_name": "x"}, {"image_name": "y"}])]])
    assert [s.graph.nodes["r"].image.image_name for s in expand_batch(batch)] == ["x", "y"]


def test_zipped_data_of_unequal_length_is_refused() -> None:
    batch = Batch(graph=THREE_INTEGERS, data=[[datum("a", "value", [1, 2]), datum("b", "value", [1])]])
    with pytest.raises(InvalidBatchError) as caught:
        item_count(batch)
    assert caught.value.loc == ("data", 0)
    assert "[2, 1]" in caught.value.message


def test_a_field_given_twice_is_refused() -> None:
    batch = Batch(graph=THREE_INTEGERS, data=[[datum("a", "value", [1])], [datum("a", "value", [2])]])
    with pytest.raises(InvalidBatchError) as caught:
        expand_batch(batch)
    assert caught.value.loc == ("data", 1, 0)
    assert "a.value" in caught.value.message


def test_an_empty_group_is_refused() -> None:
    with pytest.raises(InvalidBatchError) as caught:
        item_count(Batch(graph=THREE_INTEGERS, data=[[datum("a", "value", [1])], []]))
    assert caught.value.loc == ("data", 1)


@pytest.mark.parametrize(
    ("bad", "loc", "reason"),
    [
        (datum("a", "value", [1, "many"]), ("data", 0, 0, "items", 1), "valid integer"),
        (datum("zz", "value", [1]), ("data", 0, 0, "items", 0), "'zz' is not in the graph"),
        (datum("a", "nope", [1]), ("data", 0, 0, "items", 0), "no input 'nope'"),
    ],
    ids=["wrong-type", "unknown-node", "unknown-field"],
)
def test_a_bad_datum_is_named_by_its_place(bad: BatchDatum, loc: tuple[Any, ...], reason: str) -> None:
    with pytest.raises(InvalidBatchError) as caught:
        expand_batch(Batch(graph=THREE_INTEGERS, data=[[bad]]))
    assert caught.value.loc == loc
    assert reason in caught.value.message


def test_graph_errors_name_the_node_or_the_edge_index() -> None:
    missing_input = graph({"r": {"type": "image_resize"}})
    with pytest.raises(InvalidBatchError) as caught:
        expand_batch(Batch(graph=missing_input))
    assert caught.value.loc == ("graph", "nodes", "r")
    assert caught.value.kind == "graph_invalid"

    dangling = graph(
        {"a": {"type": "integer"}, "b": {"type": "float"}}, [("a", "value", "b", "value"), ("x", "value", "b", "value")]
    )
    with pytest.raises(InvalidBatchError) as caught:
        expand_batch(Batch(graph=dangling))
    assert caught.value.loc == ("graph", "edges", 1)
    assert "'x' is not in the graph" in caught.value.message


def test_the_same_edge_twice_is_named_by_its_own_index() -> None:
    # Two equal edges: the second is the one refused, and the loc says so (not the first equal one's index).
    twice = graph(
        {"a": {"type": "integer"}, "b": {"type": "float"}}, [("a", "value", "b", "value"), ("a", "value", "b", "value")]
    )
    with pytest.raises(InvalidBatchError) as caught:
        expand_batch(Batch(graph=twice))
    assert caught.value.loc == ("graph", "edges", 1)
    assert "already fed" in caught.value.message


def test_data_validate_only_the_nodes_they_change() -> None:
    # A 2,000-node chain and 300 values: the graph is validated once, each value re-validates its own node,
    # and every other node is the batch graph's own object (the old expansion re-validated the whole graph
    # for every value: minutes here).
    nodes = {f"n{i}": {"type": "image_resize", "width": 8, "height": 8} for i in range(2_000)}
    nodes["n0"]["image"] = {"image_name": "start.png"}
    chain = graph(nodes, [(f"n{i}", "image", f"n{i + 1}", "image") for i in range(1_999)])
    batch = Batch(graph=chain, data=[[datum("n5", "width", list(range(1, 301)))]])
    start = time.process_time()
    sessions = expand_batch(batch)
    took = time.process_time() - start
    assert [s.graph.nodes["n5"].width for s in sessions] == list(range(1, 301))  # type: ignore[attr-defined]
    assert all(s.graph.nodes["n6"] is chain.nodes["n6"] for s in sessions)
    assert all(s.graph.edges == chain.edges for s in sessions)
    assert took < 5.0, f"{took:.1f} s"


def test_values_for_one_node_from_two_groups_are_validated_together() -> None:
    # rand_int needs low < high: each combination's node is checked with both of its values in place.
    rand = graph({"r": {"type": "rand_int", "low": 0, "high": 10}})
    batch = Batch(graph=rand, data=[[datum("r", "low", [20, 30])], [datum("r", "high", [40, 25])]])
    with pytest.raises(InvalidBatchError) as caught:
        expand_batch(batch)
    # (20, 40) and (20, 25) pass; (30, 40) passes; (30, 25) fails: the last value put into the node is named.
    assert caught.value.loc == ("data", 1, 0, "items", 1)
    assert "node 'r' (rand_int)" in caught.value.message


def test_a_graph_over_max_graph_nodes_is_refused_before_validation() -> None:
    # Four nodes, one of them invalid (a required input unset): the size is what the answer names.
    four = graph(
        {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}, "r": {"type": "image_resize"}}
    )
    with pytest.raises(InvalidBatchError) as caught:
        expand_batch(Batch(graph=four), max_graph_nodes=3)
    assert caught.value.loc == ("graph", "nodes")
    assert caught.value.kind == "graph_too_large"
    assert caught.value.message == "the graph has 4 nodes; at most 3 are allowed (max_graph_nodes)"
    with pytest.raises(InvalidBatchError) as caught:
        expand_batch(Batch(graph=four), max_graph_nodes=4)
    assert caught.value.kind == "graph_invalid"
    assert len(expand_batch(Batch(graph=THREE_INTEGERS), max_graph_nodes=3)) == 1
