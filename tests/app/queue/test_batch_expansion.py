"""Batches expanded into graphs: data zipped within a group, groups combined as a product, each graph validated."""

from __future__ import annotations

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
