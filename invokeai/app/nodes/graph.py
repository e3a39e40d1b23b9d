"""The graph model (its node union built from the registry), its validation, execution order, and the steps the
session processor needs: preparing a node from its predecessors' outputs, and substituting a batch value.

Validation costs time linear in nodes plus edges: it indexes the edges once, and what it finds (the execution
order, each node's incoming edges) is kept in a ValidatedGraph, so that running the graph or putting batch data
into it validates only the nodes that change."""

from __future__ import annotations

import copy
import functools
import heapq
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from invokeai.app.nodes.base import BaseInvocation, BaseInvocationOutput, Input, invocation_classes
from invokeai.app.nodes.collect import COLLECTION, ITEM, CollectInvocation
from invokeai.app.nodes.compat import can_connect, list_item_types, type_name, union_members


class EdgeConnection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_id: str = Field(description="The id of the node")
    field: str = Field(description="The name of the field: an output of a source node, an input of a destination")

    def __str__(self) -> str:
        return f"{self.node_id}.{self.field}"


class Edge(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: EdgeConnection = Field(description="The output the value comes from")
    destination: EdgeConnection = Field(description="The input the value goes into")

    def __str__(self) -> str:
        return f"{self.source} -> {self.destination}"


def _node_union(classes: Iterable[type[BaseInvocation]]) -> Any:
    members = tuple(classes)
    if len(members) < 2:
        raise RuntimeError("the graph's node union needs at least two registered node types")
    return Annotated[Union[members], Field(discriminator="type")]  # noqa: UP007 - built at runtime


# Built once, when this module is first imported: invokeai.app.nodes imports every node module before this one,
# so every registered node type is in the union (and so in the OpenAPI document).
AnyInvocation = _node_union(invocation_classes())


class Graph(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: uuid.uuid4().hex, description="The id of this graph")
    nodes: dict[str, AnyInvocation] = Field(  # type: ignore[valid-type]
        default_factory=dict, description="The nodes of this graph, by node id"
    )
    edges: list[Edge] = Field(default_factory=list, description="The connections between the nodes")


class GraphValidationError(ValueError):
    """A graph that cannot run; the message names the node or edge and the reason.

    edge_index: the edge's place in `graph.edges` (an edge may appear twice, so the Edge alone cannot say which).
    field: the node input the problem is in, where it is one input (batch data map it back to their datum)."""

    def __init__(
        self,
        message: str,
        *,
        node_id: str | None = None,
        edge: Edge | None = None,
        edge_index: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.node_id = node_id
        self.edge = edge
        self.edge_index = edge_index
        self.field = field

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class _NodeClass:
    """What validation asks of a node class, worked out once per class instead of once per node or edge."""

    inputs: dict[str, Any]  # name -> InputSpec
    input_types: dict[str, Any]
    outputs: dict[str, Any]
    connection_only: tuple[str, ...]
    required: tuple[str, ...]


@functools.cache
def _node_class(cls: type[BaseInvocation]) -> _NodeClass:
    inputs = cls.input_specs()
    return _NodeClass(
        inputs,
        cls.input_types(),
        cls.output_class().output_fields(),
        tuple(name for name, spec in inputs.items() if spec.input is Input.CONNECTION),
        tuple(name for name, spec in inputs.items() if spec.required),
    )


def _node_data(node: BaseInvocation) -> dict[str, Any]:
    """What was given for a node (unset inputs stay unset), in a form the node's class validates again."""
    return {"id": node.id, "type": node.type, **node.model_dump(include=set(node.model_fields_set))}


def _describe_errors(error: ValidationError, skip: int) -> str:
    """pydantic's errors as 'field: reason' (`skip` leading loc parts that the caller already names)."""
    parts = []
    for item in error.errors(include_url=False):
        loc = ".".join(str(part) for part in item["loc"][skip:])
        parts.append(f"{loc}: {item['msg']}" if loc else item["msg"])
    return "; ".join(parts)


def _check_edge(graph: Graph, index: int, edge: Edge) -> None:
    """Why an edge cannot be; called only for an edge that failed the fast checks in validate_graph."""
    source = graph.nodes.get(edge.source.node_id)
    if source is None:
        raise GraphValidationError(
            f"edge {edge}: source node {edge.source.node_id!r} is not in the graph", edge=edge, edge_index=index
        )
    destination = graph.nodes.get(edge.destination.node_id)
    if destination is None:
        raise GraphValidationError(
            f"edge {edge}: destination node {edge.destination.node_id!r} is not in the graph",
            edge=edge,
            edge_index=index,
        )
    outputs = _node_class(type(source)).outputs
    if edge.source.field not in outputs:
        raise GraphValidationError(
            f"edge {edge}: node {source.id!r} ({source.type}) has no output {edge.source.field!r}; "
            f"its outputs are {sorted(outputs)}",
            edge=edge,
            edge_index=index,
        )
    specs = _node_class(type(destination)).inputs
    spec = specs.get(edge.destination.field)
    if spec is None:
        raise GraphValidationError(
            f"edge {edge}: node {destination.id!r} ({destination.type}) has no input {edge.destination.field!r}; "
            f"its inputs are {sorted(specs)}",
            edge=edge,
            edge_index=index,
        )
    if spec.input is Input.DIRECT:
        raise GraphValidationError(
            f"edge {edge}: input {edge.destination.field!r} of node {destination.id!r} cannot be connected; "
            "set its value in the node",
            edge=edge,
            edge_index=index,
        )
    source_type = outputs[edge.source.field]
    destination_type = _node_class(type(destination)).input_types[edge.destination.field]
    raise GraphValidationError(
        f"edge {edge}: output type {type_name(source_type)} does not fit input type {type_name(destination_type)}",
        edge=edge,
        edge_index=index,
    )


@functools.cache
def _edge_fits(source: type[BaseInvocation], output: str, destination: type[BaseInvocation], input_name: str) -> bool:
    """Whether an edge between these classes' fields may be, in every respect _check_edge checks."""
    outputs = _node_class(source).outputs
    spec = _node_class(destination).inputs.get(input_name)
    if output not in outputs or spec is None or spec.input is Input.DIRECT:
        return False
    return can_connect(outputs[output], _node_class(destination).input_types[input_name])


def _unset_inputs(node_id: str, node: BaseInvocation, given: Collection[str]) -> tuple[str, ...]:
    """The node's required inputs that are not set (an edge must feed them); GraphValidationError for a
    connection-only input that is set."""
    node_class = _node_class(type(node))
    fields_set = node.model_fields_set
    for name in node_class.connection_only:
        if name in fields_set or name in given:
            raise GraphValidationError(
                f"node {node_id!r} ({node.type}): input {name!r} takes only a connection, not a value",
                node_id=node_id,
                field=name,
            )
    for name in node_class.required:
        if name in fields_set or name in given:
            return tuple(name for name in node_class.required if name not in fields_set and name not in given)
    # None of them set (each image_resize of a chain): the class's own tuple, not a new one per node.
    return node_class.required


# The edges into one node: none, the one edge (most nodes), or input name -> edge.
_Fed = Edge | dict[str, Edge] | None


def _as_table(fed: _Fed) -> Mapping[str, Edge]:
    if fed is None:
        return {}
    if isinstance(fed, Edge):
        return {fed.destination.field: fed}
    return fed


def _find_cycle(
    ids: list[str],
    rank: Mapping[str, int],
    left: list[int],
    predecessor: list[int],
    incoming: Sequence[_Fed],
) -> list[str]:
    """One cycle among the nodes Kahn's algorithm could not order (those with `left` > 0, by rank), as a closed
    path of node ids."""
    # Each node left over still has a predecessor left over, so walking backwards from any of them must come
    # back to a node already visited; the walk from there on, reversed, is a cycle.
    current = next(index for index, count in enumerate(left) if count)
    walk: list[int] = []
    seen: dict[int, int] = {}
    while current not in seen:
        seen[current] = len(walk)
        walk.append(current)
        # One predecessor of each node is kept as an int: when it is left over, no edge need be read again.
        if left[predecessor[current]]:
            current = predecessor[current]
            continue
        for edge in _as_table(incoming[current]).values():
            source = rank[edge.source.node_id]
            if left[source]:
                current = source
                break
    cycle = walk[seen[current] :]
    cycle.reverse()
    # Start the report at the node listed first, so a given graph always gets the same message.
    first = cycle.index(min(cycle))
    cycle = cycle[first:] + cycle[:first]
    return [ids[index] for index in (*cycle, cycle[0])]


# A long cycle is named by its first and last nodes: the whole of a 16,000-node loop would be a 200 KB message.
_CYCLE_SHOWN = 10


def _describe_cycle(cycle: list[str]) -> str:
    names = [repr(node_id) for node_id in cycle]
    if len(names) > 3 * _CYCLE_SHOWN:
        hidden = len(names) - 2 * _CYCLE_SHOWN
        names = [*names[:_CYCLE_SHOWN], f"... ({hidden} more nodes)", *names[-_CYCLE_SHOWN:]]
    return "the graph has a cycle: " + " -> ".join(names)


def _topological_order(
    ids: list[str],
    rank: Mapping[str, int],
    indegree: list[int],
    successors: tuple[list[int], dict[int, list[int]]],
    predecessor: list[int],
    incoming: Sequence[_Fed],
) -> list[str]:
    """Kahn's algorithm on the nodes by rank; `indegree` is used up. GraphValidationError naming a cycle.

    successors: each node's first successor (-1 for none) in a flat list, and the others of the nodes that have
    more; flat, because at 64k nodes a list per node costs more in memory traffic than the sort itself.
    predecessor: for each node fed by an edge, the rank of one node feeding it (where the cycle walk looks first)."""
    # Among the nodes ready to run, the one listed first in the graph goes first: the same graph always runs in
    # the same order.
    ready = [index for index, degree in enumerate(indegree) if degree == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(ids[index])
        first = successors[0][index]
        if first < 0:
            continue
        for successor in (first, *successors[1].get(index, ())):
            indegree[successor] -= 1
            if indegree[successor] == 0:
                heapq.heappush(ready, successor)
    if len(order) != len(ids):
        cycle = _find_cycle(ids, rank, indegree, predecessor, incoming)
        raise GraphValidationError(_describe_cycle(cycle), node_id=cycle[0])
    return order


@dataclass(frozen=True, eq=False)
class ValidatedGraph:
    """A graph that validate_graph passed, with what it found: the execution order and each node's incoming
    edges. Treat the graph as frozen: the order and the index describe it as it was validated."""

    graph: Graph
    order: tuple[str, ...]
    rank: Mapping[str, int]  # node id -> its place in graph.nodes
    incoming_by_rank: Sequence[_Fed]  # the edges feeding each node, by rank

    def incoming(self, node_id: str) -> Mapping[str, Edge]:
        """Input name -> the edge feeding it, for one node of the graph."""
        return _as_table(self.incoming_by_rank[self.rank[node_id]])

    def check_settable(self, node_id: str, *fields: str) -> BaseInvocation:
        """The node, if each of `fields` is an input of it that may be given a value; GraphValidationError
        otherwise."""
        node = self.graph.nodes.get(node_id)
        if node is None:
            raise GraphValidationError(f"node {node_id!r} is not in the graph", node_id=node_id)
        for field in fields:
            self._check_settable(node, node_id, field)
        return node

    def _check_settable(self, node: BaseInvocation, node_id: str, field: str) -> None:
        spec = _node_class(type(node)).inputs.get(field)
        if spec is None:
            raise GraphValidationError(f"node {node_id!r} ({node.type}) has no input {field!r}", node_id=node_id)
        if spec.input is Input.CONNECTION:
            raise GraphValidationError(
                f"node {node_id!r} ({node.type}): input {field!r} takes only a connection, not a value",
                node_id=node_id,
                field=field,
            )
        edge = self.incoming(node_id).get(field)
        if edge is not None:
            raise GraphValidationError(
                f"node {node_id!r} ({node.type}): input {field!r} is fed by edge {edge}; it cannot also be set",
                node_id=node_id,
                edge=edge,
                field=field,
            )

    def with_values(self, values: Mapping[str, Mapping[str, Any]]) -> Graph:
        """A copy of the graph with inputs set ({node_id: {field: value}}, batch data), each changed node
        validated by its class with all its new values together. Nothing else is validated again: setting an
        input value changes no edge, no node's type and no order, so the rest of validate_graph still holds.
        Unchanged nodes and the edges are shared with this graph, not copied."""
        nodes = dict(self.graph.nodes)
        for node_id, fields in values.items():
            node = self.check_settable(node_id, *fields) if fields else None
            if node is None:
                continue
            try:
                nodes[node_id] = type(node).model_validate({**_node_data(node), **fields})
            except ValidationError as error:
                first = error.errors(include_url=False)[0]["loc"]
                raise GraphValidationError(
                    f"node {node_id!r} ({node.type}): {_describe_errors(error, skip=0)}",
                    node_id=node_id,
                    field=str(first[0]) if first and first[0] in fields else None,
                ) from error
        return Graph.model_construct(id=self.graph.id, nodes=nodes, edges=self.graph.edges)

    def prepare_node(self, node_id: str, outputs: dict[str, BaseInvocationOutput]) -> BaseInvocation:
        """prepare_node with the incoming edges looked up in the index, not searched for among all edges."""
        fed = self.incoming(node_id) if node_id in self.rank else {}
        return _prepare(self.graph, node_id, list(fed.values()), outputs)


def validate_graph(graph: Graph, given: Iterable[tuple[str, str]] = ()) -> ValidatedGraph:
    """The graph with its execution order, or GraphValidationError for the first problem that would stop it
    from running. Time linear in nodes plus edges: one pass over the nodes, one over the edges, the unset
    required inputs, then the ordering on ints (each node touched as few times as can be: at 64k nodes, reading
    a node again costs more than the check).

    given: (node id, input) pairs that will be set by with_values (a batch's data) and so count as set."""
    given_by_node: dict[str, set[str]] = {}
    for node_id, field in given:
        given_by_node.setdefault(node_id, set()).add(field)
    ids = list(graph.nodes)
    rank: dict[str, int] = {}
    classes: list[type[BaseInvocation]] = []
    # Nodes with required inputs left unset (by rank), and those inputs: two lists, not a tuple per node.
    unset: list[int] = []
    unset_names: list[tuple[str, ...]] = []
    for index, (key, node) in enumerate(graph.nodes.items()):
        if key != node.id:
            raise GraphValidationError(
                f"node {key!r}: its id is {node.id!r}; a node's id must equal its key in `nodes`", node_id=key
            )
        rank[key] = index
        classes.append(type(node))
        names = _unset_inputs(key, node, given_by_node.get(key, ()))
        if names:
            unset.append(index)
            unset_names.append(names)
    incoming: list[_Fed] = [None] * len(ids)
    indegree = [0] * len(ids)
    first_successor = [-1] * len(ids)
    more_successors: dict[int, list[int]] = {}
    predecessor = [0] * len(ids)
    # The edges out of collect nodes, for the collected-type checks after the edges' own.
    collected_out: dict[int, list[Edge]] = {}
    for index, edge in enumerate(graph.edges):
        source, destination = edge.source, edge.destination
        s, d = rank.get(source.node_id), rank.get(destination.node_id)
        if s is None or d is None or not _edge_fits(classes[s], source.field, classes[d], destination.field):
            _check_edge(graph, index, edge)
        assert s is not None and d is not None  # _check_edge raised otherwise
        fed = incoming[d]
        if fed is None:
            # Most nodes are fed by one edge: it is kept as it is, and a table made only for a second one.
            incoming[d] = edge
        else:
            if isinstance(fed, Edge):
                fed = incoming[d] = {fed.destination.field: fed}
            earlier = fed.get(destination.field)
            if earlier is not None and destination.field == ITEM and classes[d] is CollectInvocation:
                # InvokeAI's collect takes any number of edges into `item`; each is kept under a key of its own.
                fed[f"{ITEM}#{len(fed)}"] = edge
            elif earlier is not None:
                raise GraphValidationError(
                    f"edge {edge}: input {destination} is already fed by edge {earlier}; "
                    "an input takes at most one edge (only collect's item takes several)",
                    edge=edge,
                    edge_index=index,
                )
            else:
                fed[destination.field] = edge
        if classes[s] is CollectInvocation:
            collected_out.setdefault(s, []).append(edge)
        indegree[d] += 1
        predecessor[d] = s
        if first_successor[s] < 0:
            first_successor[s] = d
        else:
            more_successors.setdefault(s, []).append(d)
    for index, names in zip(unset, unset_names, strict=True):
        fed = _as_table(incoming[index])
        for name in names:
            if name not in fed:
                node = graph.nodes[ids[index]]
                raise GraphValidationError(
                    f"node {node.id!r} ({node.type}): required input {name!r} is neither set nor connected",
                    node_id=node.id,
                    field=name,
                )
    order = _topological_order(ids, rank, indegree, (first_successor, more_successors), predecessor, incoming)
    if CollectInvocation in classes:
        _check_collectors(graph, ids, rank, classes, incoming, collected_out)
    return ValidatedGraph(graph, tuple(order), rank, incoming)


def _root_types(types: Iterable[Any]) -> list[Any]:
    """The types among `types` that are no subclass of another of them (Any left out): one root means the values
    are all of one type, as InvokeAI's collect requires."""
    distinct = list(dict.fromkeys(t for t in types if t is not Any))
    roots = []
    for tp in distinct:
        covered = any(
            other is not tp and isinstance(tp, type) and isinstance(other, type) and issubclass(tp, other)
            for other in distinct
        )
        if not covered:
            roots.append(tp)
    return roots


def _check_collectors(
    graph: Graph,
    ids: list[str],
    rank: Mapping[str, int],
    classes: Sequence[type[BaseInvocation]],
    incoming: Sequence[_Fed],
    collected_out: Mapping[int, list[Edge]],
) -> None:
    """InvokeAI's rules for collect nodes: each has an edge in; what its edges bring (the items' types, the items
    of a collection fed in) is of one type; and its collection goes only into list inputs whose items take that
    type. GraphValidationError naming the collect node otherwise."""
    resolved: dict[int, set[Any]] = {}

    def input_types(index: int, visiting: frozenset[int] = frozenset()) -> set[Any]:
        if index in resolved:
            return resolved[index]
        types: set[Any] = set()
        for edge in _as_table(incoming[index]).values():
            source = rank[edge.source.node_id]
            annotation = _node_class(classes[source]).outputs[edge.source.field]
            if edge.destination.field == ITEM:
                types.update(union_members(annotation) or [Any])
            elif classes[source] is CollectInvocation and source not in visiting:
                types.update(input_types(source, visiting | {index}))
            else:
                types.update(list_item_types(annotation) or [Any])
        resolved[index] = types
        return types

    for index, cls in enumerate(classes):
        if cls is not CollectInvocation:
            continue
        node_id = ids[index]
        if not _as_table(incoming[index]):
            raise GraphValidationError(
                f"node {node_id!r} (collect): a collect node needs at least one edge into {ITEM!r} or {COLLECTION!r}",
                node_id=node_id,
            )
        roots = _root_types(input_types(index))
        if len(roots) > 1:
            raise GraphValidationError(
                f"node {node_id!r} (collect): its items must be of one type; its edges bring "
                f"{', '.join(sorted(type_name(t) for t in roots))}",
                node_id=node_id,
            )
        root = roots[0] if roots else None
        for edge in collected_out.get(index, ()):
            destination = graph.nodes[edge.destination.node_id]
            annotation = _node_class(type(destination)).input_types[edge.destination.field]
            items = list_item_types(annotation)
            if items is None:
                raise GraphValidationError(
                    f"edge {edge}: a collect node's collection goes only into a list input; "
                    f"{edge.destination.field!r} is {type_name(annotation)}",
                    node_id=node_id,
                    edge=edge,
                )
            if root is not None and Any not in items and not any(can_connect(root, item) for item in items):
                raise GraphValidationError(
                    f"edge {edge}: node {node_id!r} collects {type_name(root)}, which input "
                    f"{edge.destination.field!r} ({type_name(annotation)}) does not take",
                    node_id=node_id,
                    edge=edge,
                )


def execution_order(graph: Graph) -> list[str]:
    """Node ids in an order where every node comes after the nodes feeding it; deterministic for a graph.
    GraphValidationError where the graph would not run (a cycle, among others)."""
    return list(validate_graph(graph).order)


def _prepare(
    graph: Graph, node_id: str, incoming: Sequence[Edge], outputs: dict[str, BaseInvocationOutput]
) -> BaseInvocation:
    node = graph.nodes.get(node_id)
    if node is None:
        raise GraphValidationError(f"node {node_id!r} is not in the graph", node_id=node_id)
    data = _node_data(node)
    if isinstance(node, CollectInvocation):
        # The items go into `collection`, after what an edge into `collection` brings, in the order of their source
        # nodes' ids (as InvokeAI orders them); `item` itself stays unset.
        incoming = sorted(incoming, key=lambda e: (e.destination.field == ITEM, e.source.node_id))
    for edge in incoming:
        output = outputs.get(edge.source.node_id)
        if output is None:
            raise GraphValidationError(
                f"node {node_id!r} ({node.type}): input {edge.destination.field!r} needs the output of node "
                f"{edge.source.node_id!r}, which has not run",
                node_id=node_id,
                edge=edge,
            )
        # A copy: a node must not be able to change what another node received or returned.
        value = copy.deepcopy(getattr(output, edge.source.field))
        if isinstance(node, CollectInvocation):
            collected = data.setdefault(COLLECTION, [])
            if edge.destination.field == ITEM:
                collected.append(value)
            else:
                collected.extend(value if isinstance(value, list) else [value])
            continue
        data[edge.destination.field] = value
    try:
        prepared = type(node).model_validate(data)
    except ValidationError as error:
        raise GraphValidationError(
            f"node {node_id!r} ({node.type}): {_describe_errors(error, skip=0)}", node_id=node_id
        ) from error
    missing = prepared.missing_inputs()
    if missing:
        raise GraphValidationError(
            f"node {node_id!r} ({node.type}): required input {missing[0]!r} is neither set nor connected",
            node_id=node_id,
        )
    return prepared


def prepare_node(graph: Graph, node_id: str, outputs: dict[str, BaseInvocationOutput]) -> BaseInvocation:
    """The node, ready to invoke: each connected input holds (a copy of) the output feeding it, and the whole
    node has passed its class's validation, so a value that arrives by edge meets the same constraints.
    Searches the graph's edges; running a whole graph, use ValidatedGraph.prepare_node."""
    return _prepare(graph, node_id, [e for e in graph.edges if e.destination.node_id == node_id], outputs)


def substitute_field(graph: Graph, node_id: str, field: str, value: Any) -> Graph:
    """A valid copy of `graph` with one input of one node set to `value`. Validates the whole graph each call:
    for many values, validate once (validate_graph) and call ValidatedGraph.with_values for each."""
    return validate_graph(graph, [(node_id, field)]).with_values({node_id: {field: value}})
