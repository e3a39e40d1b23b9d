"""A batch expanded into the graphs of its queue items, each validated before anything is stored."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from pydantic import ValidationError

from invokeai.app.nodes.graph import Edge, Graph, GraphValidationError, substitute_field, validate_graph
from invokeai.app.services.queue_models import Batch, BatchDatum, NodeFieldValue

Loc = tuple[str | int, ...]


class InvalidBatchError(ValueError):
    """A batch that cannot run; `loc` is the path to the culprit inside the batch, as in FastAPI's 422 errors."""

    def __init__(self, loc: Loc, message: str, kind: str = "batch_invalid") -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.kind = kind


@dataclass(frozen=True)
class ExpandedSession:
    graph: Graph
    field_values: list[NodeFieldValue]


def item_count(batch: Batch) -> int:
    """How many queue items the batch makes, without expanding it (so an oversized batch is refused cheaply).

    Raises InvalidBatchError for data that cannot be combined."""
    groups = batch.data or []
    _check_data(groups)
    return batch.runs * math.prod(len(group[0].items) for group in groups)


def _graph_loc(graph: Graph, error: GraphValidationError) -> Loc:
    if error.edge is not None:
        edge = error.edge
        if isinstance(edge, Edge) and edge in graph.edges:
            return ("graph", "edges", graph.edges.index(edge))
        if isinstance(edge, int):
            return ("graph", "edges", edge)
    if error.node_id is not None:
        return ("graph", "nodes", error.node_id)
    return ("graph",)


def validated(graph: Graph, context: str = "") -> Graph:
    try:
        validate_graph(graph)
    except GraphValidationError as error:
        raise InvalidBatchError(_graph_loc(graph, error), error.message + context, "graph_invalid") from None
    return graph


def _check_data(data: list[list[BatchDatum]]) -> None:
    seen: dict[tuple[str, str], Loc] = {}
    for group_index, group in enumerate(data):
        if not group:
            raise InvalidBatchError(("data", group_index), "a data group must hold at least one datum")
        lengths = [len(datum.items) for datum in group]
        if len(set(lengths)) > 1:
            raise InvalidBatchError(
                ("data", group_index),
                f"the data in one group are zipped, so they need equally many items; these have {lengths}",
            )
        for datum_index, datum in enumerate(group):
            target = (datum.node_path, datum.field_name)
            if target in seen:
                raise InvalidBatchError(
                    ("data", group_index, datum_index),
                    f"{datum.node_path}.{datum.field_name} is already given by data{list(seen[target])}",
                )
            seen[target] = (group_index, datum_index)


def _substituted(graph: Graph, datum: BatchDatum, loc: Loc, value: object) -> Graph:
    try:
        return substitute_field(graph, datum.node_path, datum.field_name, value)
    except GraphValidationError as error:
        raise InvalidBatchError(loc, error.message, "graph_invalid") from None
    except ValidationError as error:
        reasons = "; ".join(detail["msg"] for detail in error.errors())
        raise InvalidBatchError(loc, f"{datum.node_path}.{datum.field_name}: {reasons}", "graph_invalid") from None


def _zipped(group_index: int, group: list[BatchDatum]) -> list[list[tuple[Loc, BatchDatum, object]]]:
    """One row per item index k: each datum of the group with its k-th value (and where that value is)."""
    return [
        [
            (("data", group_index, datum_index, "items", k), datum, datum.items[k])
            for datum_index, datum in enumerate(group)
        ]
        for k in range(len(group[0].items))
    ]


def expand_batch(batch: Batch) -> list[ExpandedSession]:
    """One session per combination of data values (runs are not repeated here), every graph validated.

    Raises InvalidBatchError naming the first bad graph part or datum; nothing has been stored at that point.
    """
    if not batch.data:
        return [ExpandedSession(validated(batch.graph), [])]
    _check_data(batch.data)
    groups = [_zipped(group_index, group) for group_index, group in enumerate(batch.data)]
    sessions = []
    for combination in itertools.product(*groups):
        graph = batch.graph
        values = []
        for row in combination:
            for loc, datum, value in row:
                graph = _substituted(graph, datum, loc, value)
                values.append(NodeFieldValue(node_path=datum.node_path, field_name=datum.field_name, value=value))
        described = ", ".join(f"{v.node_path}.{v.field_name}={v.value!r}" for v in values)
        sessions.append(ExpandedSession(validated(graph, f" (with batch data {described})"), values))
    return sessions
