"""The session queue's data: batches as clients send them, queue items as the queue stores and returns them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Union
from uuid import uuid4

from pydantic import BaseModel, Field, JsonValue

from invokeai.app.nodes.base import output_classes
from invokeai.app.nodes.graph import Graph

QueueItemStatus = Literal["pending", "in_progress", "completed", "failed", "canceled"]
QUEUE_ITEM_STATUSES: tuple[QueueItemStatus, ...] = ("pending", "in_progress", "completed", "failed", "canceled")
FINISHED_STATUSES: tuple[QueueItemStatus, ...] = ("completed", "failed", "canceled")

# Queue and batch ids go into URLs and logs: keep them to characters that need no escaping anywhere.
ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
# SQLite integers are signed 64-bit; a larger id or offset would overflow in the driver instead of matching nothing.
MAX_SQL_INT = 2**63 - 1
MAX_RUNS = 10_000


# Any node's output, told apart by its `type`; built like the graph's node union (invokeai.app.nodes registers every
# node module before graph.py is imported), so every output schema is in the OpenAPI document.
AnyInvocationOutput = Annotated[Union[tuple(output_classes())], Field(discriminator="type")]  # noqa: UP007


def new_id() -> str:
    return uuid4().hex


class BatchDatum(BaseModel):
    """Values for one node field: each item goes into its own queue item."""

    node_path: str = Field(description="The id of the node whose field the items replace.", min_length=1)
    field_name: str = Field(description="The input field the items replace.", min_length=1)
    items: list[JsonValue] = Field(description="The values, one per queue item.", min_length=1)


class Batch(BaseModel):
    """A graph to run `runs` times for each combination of `data` values."""

    batch_id: str = Field(
        default_factory=new_id,
        description="Chosen by the server unless given; cancel_by_batch_ids cancels every item of a batch.",
        pattern=ID_PATTERN,
    )
    graph: Graph = Field(description="The graph every item of the batch runs, with the data values put in.")
    runs: int = Field(1, ge=1, le=MAX_RUNS, description="How many times each combination of data values runs.")
    data: list[list[BatchDatum]] | None = Field(
        None,
        description="Groups of field values. The data in one group are zipped (so their items must be equally "
        "many); the groups are combined as a cartesian product. Each combination is one queue item per run.",
    )
    # InvokeAI's clients send both with every batch; kept on each item and returned, as InvokeAI does.
    origin: str | None = Field(
        None, max_length=1000, description="Where the batch comes from (free text, e.g. a client's name)."
    )
    destination: str | None = Field(
        None, max_length=1000, description="Where the batch's results should go (free text, e.g. 'canvas')."
    )
    # InvokeAI's frontend sends the workflow a batch was built from; it is embedded in every image the batch
    # makes (the invokeai_workflow PNG chunk), as InvokeAI does, and otherwise not read. The request body limit
    # bounds it.
    workflow: dict[str, JsonValue] | None = Field(
        None, description="The client's workflow the graph was built from, stored in the images it makes."
    )


class EnqueueBatchBody(BaseModel):
    batch: Batch
    prepend: bool = Field(False, description="Run this batch before every pending item (a higher priority).")


class EnqueueBatchResult(BaseModel):
    queue_id: str
    enqueued: int = Field(description="How many queue items were created.")
    requested: int = Field(description="How many the batch asked for (equal to enqueued: a batch is all or none).")
    batch: Batch = Field(description="The batch as accepted, with its batch_id.")
    priority: int = Field(description="The priority of the new items; higher runs first.")
    item_ids: list[int] = Field(description="The new items' ids, in the order they will run.")


class NodeFieldValue(BaseModel):
    """A value that batch data put into a node field of this item's graph."""

    node_path: str
    field_name: str
    value: JsonValue


class GraphExecutionState(BaseModel):
    """InvokeAI's session: the graph an item runs and what its nodes did. This server runs each node of the graph once,
    under its own id (InvokeAI prepares copies of nodes, e.g. one per iteration of a collection), so the prepared
    nodes are the graph's nodes and both mappings are the identity over the nodes that ran."""

    id: str = Field(description="The session id (also in the item as session_id).")
    graph: Graph = Field(description="The graph the item runs, with its batch data put in.")
    execution_graph: Graph = Field(
        description="The nodes that were prepared to run (those that ran, and the one that failed), with the edges "
        "between them; empty until the item ends."
    )
    executed: list[str] = Field(description="The nodes that ran (each once).")
    executed_history: list[str] = Field(description="The nodes that ran, in the order they ran.")
    results: dict[str, AnyInvocationOutput] = Field(  # type: ignore[valid-type]
        description="Prepared node id (here the node's id) -> that node's output, for each node that ran."
    )
    errors: dict[str, str] = Field(description="For a failed item: the failed node's id -> 'ErrorType: message'.")
    prepared_source_mapping: dict[str, str] = Field(description="Prepared node id -> the graph's node id.")
    source_prepared_mapping: dict[str, list[str]] = Field(description="The graph's node id -> its prepared nodes.")
    # InvokeAI's workflow calls (a node that runs a saved workflow as a child item); this server has none.
    workflow_call_stack: list[JsonValue] = Field(description="Always empty here.")
    workflow_call_history: list[JsonValue] = Field(description="Always empty here.")


class SessionQueueItem(BaseModel):
    item_id: int
    queue_id: str
    batch_id: str
    session_id: str
    status: QueueItemStatus
    priority: int
    field_values: list[NodeFieldValue] | None = Field(description="The batch data values in this item's graph.")
    error_type: str | None = Field(description="For a failed item: the exception's class name.")
    error_message: str | None
    error_traceback: str | None
    cancel_reason: str | None = Field(description="For a canceled item: who or what canceled it.")
    origin: str | None = Field(None, description="The batch's origin, as sent.")
    destination: str | None = Field(None, description="The batch's destination, as sent.")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    worker: str | None = Field(
        None,
        description="Who runs (or ran) the item, set when a worker claims it: `<host>:<pid>/<worker>`, the "
        "worker being its device (cuda:1) or cpu#N (e.g. gpu-box:4242/cuda:1). Null until claimed (and again once "
        "requeued).",
    )
    retried_from_item_id: int | None = Field(
        None, description="For an item made by retry_items_by_id: the failed or canceled item it retries."
    )
    read_error: str | None = Field(
        None,
        description="Set when the stored item cannot be read back (a damaged row): why. Its session and "
        "field_values are then null; a pending one fails when the processor takes it.",
    )
    session: GraphExecutionState | None = Field(
        description="InvokeAI's GraphExecutionState. Null only for an item that cannot be read (read_error)."
    )


MAX_ITEM_IDS = 1000  # item ids per request (retry_items_by_id, items_by_ids), as InvokeAI bounds them
ItemIdList = list[Annotated[int, Field(ge=1, le=MAX_SQL_INT)]]


class ItemsByIdsBody(BaseModel):
    item_ids: ItemIdList = Field(
        description="The items to fetch, in the order wanted (ids of other queues and missing ones are skipped).",
        max_length=MAX_ITEM_IDS,
    )


class ItemIdsResult(BaseModel):
    item_ids: list[int] = Field(description="Every item id of the queue, in the order asked for.")
    total_count: int = Field(description="How many there are.")


class RetryItemsResult(BaseModel):
    queue_id: str
    retried_item_ids: list[int] = Field(description="The items retried, in the order given (each once).")
    item_ids: list[int] = Field(description="The new pending items, one per retried item, in the same order.")


class SessionQueueItemPage(BaseModel):
    items: list[SessionQueueItem]
    offset: int
    limit: int
    total: int


class StatusCounts(BaseModel):
    """Items per status. `waiting` is InvokeAI's status of an item whose workflow call waits for a child item; this
    server has no workflow calls, so it is always 0."""

    pending: int
    in_progress: int
    waiting: int
    completed: int
    failed: int
    canceled: int
    total: int


class BatchStatus(StatusCounts):
    """The items of one batch per status (all 0 for a batch the queue does not have)."""

    queue_id: str
    batch_id: str
    origin: str | None = Field(description="The batch's origin, as sent.")
    destination: str | None = Field(description="The batch's destination, as sent.")


class SessionQueueCountsByDestination(StatusCounts):
    """The items of one destination per status."""

    queue_id: str
    destination: str


class CanceledResult(BaseModel):
    canceled: int = Field(description="How many items were canceled.")


class QueueCounts(StatusCounts):
    """Items per status in one queue, and the items running now (those of this queue)."""

    queue_id: str
    item_id: int | None = Field(
        description="The item in progress, if any; with several workers, the oldest of item_ids (batch_id and "
        "session_id are this item's)."
    )
    item_ids: list[int] = Field(description="Every item of this queue in progress now, oldest first.")
    batch_id: str | None
    session_id: str | None
