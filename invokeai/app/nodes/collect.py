"""InvokeAI's `collect` node: the values of every edge into its `item`, as one list.

It is the one node whose input takes more than one edge; graph.py knows it by its class: validation lets several
edges feed `item` and checks the collected types as InvokeAI does, and preparing the node puts the edges' values in
`collection` (the values of an edge into `collection` first, then those of the `item` edges by source node id)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from invokeai.app.nodes.base import BaseInvocation, BaseInvocationOutput, Input, InputField, OutputField
from invokeai.app.nodes.context import InvocationContext

ITEM = "item"
COLLECTION = "collection"


class CollectInvocationOutput(BaseInvocationOutput):
    type: Literal["collect_output"] = "collect_output"
    collection: list[Any] = OutputField(description="The collection of input items")


class CollectInvocation(BaseInvocation):
    """Collects values into a collection: every edge into `item` adds its value (all of one type)."""

    type: Literal["collect"] = "collect"
    # InvokeAI never caches a collect: its list is cheap to build again and holds the other nodes' outputs.
    use_cache: bool = Field(default=False, description="Whether to use the invocation cache for this node")
    item: Any | None = InputField(
        default=None,
        description="The item to collect (all inputs must be of the same type); several edges may feed it",
        input=Input.CONNECTION,
    )
    collection: list[Any] = InputField(
        default=[], description="An optional collection to append to", input=Input.CONNECTION
    )

    def invoke(self, context: InvocationContext) -> CollectInvocationOutput:
        return CollectInvocationOutput(collection=list(self.collection))
