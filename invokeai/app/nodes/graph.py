"""The graph model (its node union built from the registry), its validation, execution order, and the steps the
session processor needs: preparing a node from its predecessors' outputs, and substituting a batch value."""

from __future__ import annotations

import copy
import heapq
import uuid
from collections.abc import Iterable
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from invokeai.app.nodes.base import BaseInvocation, BaseInvocationOutput, Input, invocation_classes
from invokeai.app.nodes.compat import can_connect, type_name


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
    """A graph that cannot run; the message names the node or edge and the reason."""

    def __init__(self, message: str, *, node_id: str | None = None, edge: Edge | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.node_id = node_id
        self.edge = edge

    def __str__(self) -> str:
        return self.message


def _node_data(node: BaseInvocation) -> dict[str, Any]:
    """What was given for a node (unset inputs stay unset), in a form the node's class validates again."""
    return {"id": node.id, "type": node.type, **node.model_dump(include=set(node.model_fields_set))}


def _graph_data(graph: Graph) -> dict[str, Any]:
    return {
        "id": graph.id,
        "nodes": {key: _node_data(node) for key, node in graph.nodes.items()},
        "edges": [edge.model_dump() for edge in graph.edges],
    }


def _incoming(graph: Graph, node_id: str) -> list[Edge]:
    return [edge for edge in graph.edges if edge.destination.node_id == node_id]


def _describe_errors(error: ValidationError, skip: int) -> str:
    """pydantic's errors as 'field: reason' (`skip` leading loc parts that the caller already names)."""
    parts = []
    for item in error.errors(include_url=False):
        loc = ".".join(str(part) for part in item["loc"][skip:])
        parts.append(f"{loc}: {item['msg']}" if loc else item["msg"])
    return "; ".join(parts)


def _check_edge(graph: Graph, edge: Edge) -> None:
    source = graph.nodes.get(edge.source.node_id)
    if source is None:
        raise GraphValidationError(f"edge {edge}: source node {edge.source.node_id!r} is not in the graph", edge=edge)
    destination = graph.nodes.get(edge.destination.node_id)
    if destination is None:
        raise GraphValidationError(
            f"edge {edge}: destination node {edge.destination.node_id!r} is not in the graph", edge=edge
        )
    outputs = type(source).output_class().output_fields()
    if edge.source.field not in outputs:
        raise GraphValidationError(
            f"edge {edge}: node {source.id!r} ({source.type}) has no output {edge.source.field!r}; "
            f"its outputs are {sorted(outputs)}",
            edge=edge,
        )
    specs = type(destination).input_specs()
    spec = specs.get(edge.destination.field)
    if spec is None:
        raise GraphValidationError(
            f"edge {edge}: node {destination.id!r} ({destination.type}) has no input {edge.destination.field!r}; "
            f"its inputs are {sorted(specs)}",
            edge=edge,
        )
    if spec.input is Input.DIRECT:
        raise GraphValidationError(
            f"edge {edge}: input {edge.destination.field!r} of node {destination.id!r} cannot be connected; "
            "set its value in the node",
            edge=edge,
        )
    source_type = outputs[edge.source.field]
    destination_type = type(destination).input_types()[edge.destination.field]
    if not can_connect(source_type, destination_type):
        raise GraphValidationError(
            f"edge {edge}: output type {type_name(source_type)} does not fit input type {type_name(destination_type)}",
            edge=edge,
        )


def _check_inputs(graph: Graph, node_id: str, node: BaseInvocation, connected: set[str]) -> None:
    for name, spec in type(node).input_specs().items():
        is_set = name in node.model_fields_set
        if spec.input is Input.CONNECTION and is_set:
            raise GraphValidationError(
                f"node {node_id!r} ({node.type}): input {name!r} takes only a connection, not a value",
                node_id=node_id,
            )
        if spec.required and not is_set and name not in connected:
            raise GraphValidationError(
                f"node {node_id!r} ({node.type}): required input {name!r} is neither set nor connected",
                node_id=node_id,
            )


def _find_cycle(graph: Graph, among: set[str]) -> list[str]:
    """One cycle among `among` (the nodes Kahn's algorithm could not order), as a closed path of node ids."""
    # Each node left over still has a predecessor left over, so walking backwards from any of them must come
    # back to a node already visited; the walk from there on, reversed, is a cycle.
    predecessors: dict[str, str] = {}
    for edge in graph.edges:
        if edge.source.node_id in among and edge.destination.node_id in among:
            predecessors.setdefault(edge.destination.node_id, edge.source.node_id)
    current = next(node_id for node_id in graph.nodes if node_id in among)
    walk: list[str] = []
    seen: dict[str, int] = {}
    while current not in seen:
        seen[current] = len(walk)
        walk.append(current)
        current = predecessors[current]
    cycle = walk[seen[current] :]
    cycle.reverse()
    # Start the report at the node listed first, so a given graph always gets the same message.
    rank = {node_id: index for index, node_id in enumerate(graph.nodes)}
    first = min(range(len(cycle)), key=lambda index: rank[cycle[index]])
    cycle = cycle[first:] + cycle[:first]
    return [*cycle, cycle[0]]


def _topological_order(graph: Graph) -> list[str]:
    rank = {node_id: index for index, node_id in enumerate(graph.nodes)}
    indegree = dict.fromkeys(graph.nodes, 0)
    successors: dict[str, list[str]] = {node_id: [] for node_id in graph.nodes}
    for edge in graph.edges:
        if edge.source.node_id in rank and edge.destination.node_id in rank:
            successors[edge.source.node_id].append(edge.destination.node_id)
            indegree[edge.destination.node_id] += 1
    # Among the nodes ready to run, the one listed first in the graph goes first: the same graph always runs in
    # the same order.
    ready = [(rank[node_id], node_id) for node_id, degree in indegree.items() if degree == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, node_id = heapq.heappop(ready)
        order.append(node_id)
        for successor in successors[node_id]:
            indegree[successor] -= 1
            if indegree[successor] == 0:
                heapq.heappush(ready, (rank[successor], successor))
    if len(order) != len(graph.nodes):
        cycle = _find_cycle(graph, set(graph.nodes) - set(order))
        raise GraphValidationError(
            "the graph has a cycle: " + " -> ".join(repr(node_id) for node_id in cycle), node_id=cycle[0]
        )
    return order


def validate_graph(graph: Graph) -> None:
    """Raise GraphValidationError for the first problem that would stop the graph from running."""
    for key, node in graph.nodes.items():
        if key != node.id:
            raise GraphValidationError(
                f"node {key!r}: its id is {node.id!r}; a node's id must equal its key in `nodes`", node_id=key
            )
    fed: dict[tuple[str, str], Edge] = {}
    for edge in graph.edges:
        _check_edge(graph, edge)
        target = (edge.destination.node_id, edge.destination.field)
        if target in fed:
            raise GraphValidationError(
                f"edge {edge}: input {edge.destination} is already fed by edge {fed[target]}; "
                "an input takes at most one edge",
                edge=edge,
            )
        fed[target] = edge
    for node_id, node in graph.nodes.items():
        connected = {field for (destination, field) in fed if destination == node_id}
        _check_inputs(graph, node_id, node, connected)
    _topological_order(graph)


def execution_order(graph: Graph) -> list[str]:
    """Node ids in an order where every node comes after the nodes feeding it; deterministic for a graph."""
    return _topological_order(graph)


def prepare_node(graph: Graph, node_id: str, outputs: dict[str, BaseInvocationOutput]) -> BaseInvocation:
    """The node, ready to invoke: each connected input holds (a copy of) the output feeding it, and the whole
    node has passed its class's validation, so a value that arrives by edge meets the same constraints."""
    node = graph.nodes.get(node_id)
    if node is None:
        raise GraphValidationError(f"node {node_id!r} is not in the graph", node_id=node_id)
    data = _node_data(node)
    for edge in _incoming(graph, node_id):
        output = outputs.get(edge.source.node_id)
        if output is None:
            raise GraphValidationError(
                f"node {node_id!r} ({node.type}): input {edge.destination.field!r} needs the output of node "
                f"{edge.source.node_id!r}, which has not run",
                node_id=node_id,
                edge=edge,
            )
        # A copy: a node must not be able to change what another node received or returned.
        data[edge.destination.field] = copy.deepcopy(getattr(output, edge.source.field))
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


def substitute_field(graph: Graph, node_id: str, field: str, value: Any) -> Graph:
    """A validated copy of `graph` with one input of one node set to `value` (a batch's data)."""
    node = graph.nodes.get(node_id)
    if node is None:
        raise GraphValidationError(f"node {node_id!r} is not in the graph", node_id=node_id)
    spec = type(node).input_specs().get(field)
    if spec is None:
        raise GraphValidationError(f"node {node_id!r} ({node.type}) has no input {field!r}", node_id=node_id)
    if spec.input is Input.CONNECTION:
        raise GraphValidationError(
            f"node {node_id!r} ({node.type}): input {field!r} takes only a connection, not a value", node_id=node_id
        )
    for edge in _incoming(graph, node_id):
        if edge.destination.field == field:
            raise GraphValidationError(
                f"node {node_id!r} ({node.type}): input {field!r} is fed by edge {edge}; it cannot also be set",
                node_id=node_id,
                edge=edge,
            )
    data = _graph_data(graph)
    data["nodes"][node_id][field] = value
    try:
        substituted = Graph.model_validate(data)
    except ValidationError as error:
        # loc is ('nodes', node_id, node_type, field, ...): the message names the node itself.
        raise GraphValidationError(
            f"node {node_id!r} ({node.type}): {_describe_errors(error, skip=3)}", node_id=node_id
        ) from error
    validate_graph(substituted)
    return substituted
