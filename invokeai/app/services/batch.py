"""A batch expanded into the graphs of its queue items, each validated before anything is stored."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from invokeai.app.nodes.graph import Graph, GraphValidationError, ValidatedGraph, validate_graph
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


def _graph_loc(error: GraphValidationError) -> Loc:
    if error.edge_index is not None:
        return ("graph", "edges", error.edge_index)
    if error.node_id is not None:
        return ("graph", "nodes", error.node_id)
    return ("graph",)


def validated(graph: Graph, max_nodes: int | None = None, given: Iterable[tuple[str, str]] = ()) -> ValidatedGraph:
    """The graph validated once (time linear in nodes plus edges), after the node-count limit.

    max_nodes: the max_graph_nodes setting; None for no limit. given: inputs that batch data will set."""
    if max_nodes is not None and len(graph.nodes) > max_nodes:
        raise InvalidBatchError(
            ("graph", "nodes"),
            f"the graph has {len(graph.nodes)} nodes; at most {max_nodes} are allowed (max_graph_nodes)",
            "graph_too_large",
        )
    try:
        return validate_graph(graph, given)
    except GraphValidationError as error:
        raise InvalidBatchError(_graph_loc(error), error.message, "graph_invalid") from None


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


def _zipped(group_index: int, group: list[BatchDatum]) -> list[list[tuple[Loc, BatchDatum, object]]]:
    """One row per item index k: each datum of the group with its k-th value (and where that value is)."""
    return [
        [
            (("data", group_index, datum_index, "items", k), datum, datum.items[k])
            for datum_index, datum in enumerate(group)
        ]
        for k in range(len(group[0].items))
    ]


def with_field_values(
    graph: ValidatedGraph, values: Sequence[NodeFieldValue], locs: Sequence[Loc] | None = None
) -> Graph:
    """The graph with batch data put in, validating only the nodes the values change (see
    ValidatedGraph.with_values). `locs`, one per value, says where each value is in the batch for the error;
    without it the error points at the graph's node."""
    fields: dict[str, dict[str, object]] = {}
    where: dict[tuple[str, str], Loc] = {}
    for index, value in enumerate(values):
        fields.setdefault(value.node_path, {})[value.field_name] = value.value
        if locs is not None:
            where[(value.node_path, value.field_name)] = locs[index]
    try:
        return graph.with_values(fields)
    except GraphValidationError as error:
        loc = where.get((error.node_id or "", error.field or ""))
        if loc is None and locs is not None:
            # A node-wide check (several of its fields together): the last value put into that node.
            loc = next(locs[i] for i in reversed(range(len(values))) if values[i].node_path == error.node_id)
        raise InvalidBatchError(loc or _graph_loc(error), error.message, "graph_invalid") from None


def expand_batch(batch: Batch, max_graph_nodes: int | None = None) -> list[ExpandedSession]:
    """One session per combination of data values (runs are not repeated here), every graph valid.

    The batch's graph is validated once; each combination then validates only the nodes its values change.
    Raises InvalidBatchError naming the first bad graph part or datum; nothing has been stored at that point.
    """
    if not batch.data:
        validated(batch.graph, max_graph_nodes)
        return [ExpandedSession(batch.graph, [])]
    _check_data(batch.data)
    # An input that every item's data sets may be unset in the batch's graph.
    given = [(datum.node_path, datum.field_name) for group in batch.data for datum in group]
    graph = validated(batch.graph, max_graph_nodes, given)
    for group_index, group in enumerate(batch.data):
        for datum_index, datum in enumerate(group):
            try:
                graph.check_settable(datum.node_path, datum.field_name)
            except GraphValidationError as error:
                raise InvalidBatchError(("data", group_index, datum_index, "items", 0), error.message) from None
    groups = [_zipped(group_index, group) for group_index, group in enumerate(batch.data)]
    sessions = []
    for combination in itertools.product(*groups):
        cells = [cell for row in combination for cell in row]
        values = [NodeFieldValue(node_path=d.node_path, field_name=d.field_name, value=v) for _, d, v in cells]
        sessions.append(ExpandedSession(with_field_values(graph, values, [loc for loc, _, _ in cells]), values))
    return sessions
