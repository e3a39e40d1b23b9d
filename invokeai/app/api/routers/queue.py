"""/api/v1/queue/{queue_id}: enqueue batches, read and cancel items, counts, clear, prune, pause and resume."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Path, Query, status
from pydantic import BaseModel, Field

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.services.queue_models import (
    ID_PATTERN,
    MAX_ITEM_IDS,
    MAX_SQL_INT,
    BatchStatus,
    CanceledResult,
    EnqueueBatchBody,
    EnqueueBatchResult,
    ItemIdList,
    ItemIdsResult,
    ItemsByIdsBody,
    QueueCounts,
    QueueItemStatus,
    RetryItemsResult,
    SessionQueueCountsByDestination,
    SessionQueueItem,
    SessionQueueItemPage,
)
from invokeai.app.services.session_processor import ProcessorStatus
from invokeai.app.services.session_queue import MAX_LIST_ALL, RetryRefusedError, TooManyItemsError

router = APIRouter(prefix="/queue/{queue_id}", tags=["queue"], route_class=ApiRoute)

QueueId = Annotated[str, Path(description="The queue's id; InvokeAI's clients use 'default'.", pattern=ID_PATTERN)]
ItemId = Annotated[int, Path(description="The queue item's id.", ge=1, le=MAX_SQL_INT)]
BatchId = Annotated[str, Path(description="The batch's id (enqueue_batch's batch.batch_id).", pattern=ID_PATTERN)]
# As long as a batch's destination may be.
Destination = Annotated[str, Query(description="The destination, as batches name it.", max_length=1000)]


class SQLiteDirection(StrEnum):
    """InvokeAI's name for a sort direction."""

    ASC = "ASC"
    DESC = "DESC"


BATCH_INVALID_RESPONSE = {
    422: {"description": "The body is malformed, or a graph or batch datum is invalid (detail names which and why)."}
}


class SessionQueueAndProcessorStatus(BaseModel):
    queue: QueueCounts
    processor: ProcessorStatus


class CancelByBatchIdsBody(BaseModel):
    batch_ids: list[str] = Field(description="Cancel every pending or running item of these batches.", max_length=1000)


class CancelByBatchIdsResult(CanceledResult):
    pass


class CancelByDestinationResult(CanceledResult):
    pass


class CancelAllExceptCurrentResult(CanceledResult):
    pass


class DeletedResult(BaseModel):
    deleted: int = Field(description="How many items were deleted.")


@router.post(
    "/enqueue_batch",
    operation_id="enqueue_batch",
    responses={
        **BATCH_INVALID_RESPONSE,
        429: {"description": "The batch would take the pending items past max_queue_size; nothing was enqueued."},
    },
)
def enqueue_batch(queue_id: QueueId, body: EnqueueBatchBody, services: AppServices) -> EnqueueBatchResult:
    """Queue one item per run and combination of data values; validated whole before anything is stored."""
    return services.queue.enqueue_batch(queue_id, body.batch, body.prepend)


@router.get("/list", operation_id="list_queue_items")
def list_items(
    queue_id: QueueId,
    services: AppServices,
    status: Annotated[QueueItemStatus | None, Query(description="Only items with this status.")] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_SQL_INT)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> SessionQueueItemPage:
    """The queue's items, oldest first."""
    items, total = services.queue.list_items(queue_id, status, offset, limit)
    return SessionQueueItemPage(items=items, offset=offset, limit=limit, total=total)


@router.get(
    "/list_all",
    operation_id="list_all_queue_items",
    responses={
        422: {
            "description": f"The queue (or destination) has more than {MAX_LIST_ALL} items: page through them with "
            "item_ids and items_by_ids, or with list."
        }
    },
)
def list_all(
    queue_id: QueueId,
    services: AppServices,
    destination: Annotated[
        str | None, Query(description="Only the items of this destination.", max_length=1000)
    ] = None,
) -> list[SessionQueueItem]:
    """Every item of the queue, with its session, highest priority first, then oldest (InvokeAI's order)."""
    try:
        return services.queue.list_all(queue_id, destination)
    except TooManyItemsError as error:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            [{"loc": ["path", "queue_id"], "msg": str(error), "type": "too_many_items"}],
        ) from None


@router.get("/item_ids", operation_id="get_queue_item_ids")
def item_ids(
    queue_id: QueueId,
    services: AppServices,
    order_dir: Annotated[
        SQLiteDirection, Query(description="DESC: newest first; ASC: oldest first (by creation).")
    ] = SQLiteDirection.DESC,
) -> ItemIdsResult:
    """Every item id of the queue, in order of creation; items_by_ids fetches the items."""
    return services.queue.item_ids(queue_id, descending=order_dir is SQLiteDirection.DESC)


@router.post("/items_by_ids", operation_id="get_queue_items_by_item_ids")
def items_by_ids(queue_id: QueueId, body: ItemsByIdsBody, services: AppServices) -> list[SessionQueueItem]:
    """The items of these ids, in the order given; ids not in this queue are left out."""
    return services.queue.items_by_ids(queue_id, body.item_ids)


@router.get("/current", operation_id="get_current_queue_item")
def current(queue_id: QueueId, services: AppServices) -> SessionQueueItem | None:
    """The item in progress (with several workers, the oldest of them), or null."""
    return services.queue.current(queue_id)


@router.get("/next", operation_id="get_next_queue_item")
def next_item(queue_id: QueueId, services: AppServices) -> SessionQueueItem | None:
    """The pending item that runs next, or null; it is not taken."""
    return services.queue.next(queue_id)


@router.get("/b/{batch_id}/status", operation_id="get_batch_status")
def batch_status(queue_id: QueueId, batch_id: BatchId, services: AppServices) -> BatchStatus:
    """The batch's items per status; all 0 for a batch the queue does not have."""
    return services.queue.batch_status(queue_id, batch_id)


@router.put("/cancel_by_destination", operation_id="cancel_by_destination")
def cancel_by_destination(
    queue_id: QueueId, destination: Destination, services: AppServices
) -> CancelByDestinationResult:
    """Cancel every pending or running item of the destination."""
    return CancelByDestinationResult(canceled=services.queue.cancel_by_destination(queue_id, destination))


@router.get("/counts_by_destination", operation_id="counts_by_destination")
def counts_by_destination(
    queue_id: QueueId, destination: Destination, services: AppServices
) -> SessionQueueCountsByDestination:
    """The items of the destination per status."""
    return services.queue.counts_by_destination(queue_id, destination)


@router.put("/cancel_all_except_current", operation_id="cancel_all_except_current")
def cancel_all_except_current(queue_id: QueueId, services: AppServices) -> CancelAllExceptCurrentResult:
    """Cancel every pending item of the queue; the running ones run on."""
    return CancelAllExceptCurrentResult(canceled=services.queue.cancel_all_except_current(queue_id))


@router.get("/i/{item_id}", operation_id="get_queue_item", responses={404: {"description": "No such item."}})
def get_item(queue_id: QueueId, item_id: ItemId, services: AppServices) -> SessionQueueItem:
    return services.queue.get(queue_id, item_id)


@router.put("/i/{item_id}/cancel", operation_id="cancel_queue_item", responses={404: {"description": "No such item."}})
def cancel_item(queue_id: QueueId, item_id: ItemId, services: AppServices) -> SessionQueueItem:
    """Cancel a pending item, or stop a running one at its next node or step; a finished item stays as it is."""
    return services.queue.cancel(queue_id, item_id)


@router.put("/cancel_by_batch_ids", operation_id="cancel_by_batch_ids")
def cancel_by_batch_ids(queue_id: QueueId, body: CancelByBatchIdsBody, services: AppServices) -> CancelByBatchIdsResult:
    return CancelByBatchIdsResult(canceled=services.queue.cancel_by_batch_ids(queue_id, body.batch_ids))


@router.put(
    "/retry_items_by_id",
    operation_id="retry_items_by_id",
    responses={
        404: {"description": "An id is not an item of this queue (the detail names it); nothing was enqueued."},
        409: {"description": "An item is not failed or canceled (the detail names it); nothing was enqueued."},
        429: {"description": "The new items would take the pending items past max_queue_size; nothing enqueued."},
    },
)
def retry_items_by_id(
    queue_id: QueueId,
    item_ids: Annotated[
        ItemIdList,
        Body(
            description="The failed or canceled items of this queue to enqueue again (a bare array, as InvokeAI's).",
            max_length=MAX_ITEM_IDS,
        ),
    ],
    services: AppServices,
) -> RetryItemsResult:
    """Enqueue each failed or canceled item again as a new pending item, with the same graph, batch data and
    priority, and `retried_from_item_id` naming the original (which stays as it is). All or none."""
    try:
        return services.queue.retry_items_by_id(queue_id, item_ids)
    except RetryRefusedError as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None


@router.put("/clear", operation_id="clear_queue")
def clear(queue_id: QueueId, services: AppServices) -> DeletedResult:
    """Delete every item of the queue, canceling the running one."""
    return DeletedResult(deleted=services.queue.clear(queue_id))


@router.put("/prune", operation_id="prune_queue")
def prune(queue_id: QueueId, services: AppServices) -> DeletedResult:
    """Delete the queue's completed, failed and canceled items."""
    return DeletedResult(deleted=services.queue.prune(queue_id))


@router.get("/status", operation_id="get_queue_status")
def get_status(queue_id: QueueId, services: AppServices) -> SessionQueueAndProcessorStatus:
    """Items per status, the running item, and whether the processor takes items."""
    return SessionQueueAndProcessorStatus(queue=services.queue.status(queue_id), processor=services.processor.status())


@router.put("/processor/pause", operation_id="pause_processor")
def pause(queue_id: QueueId, services: AppServices) -> ProcessorStatus:
    """Take no new items (for every queue); the running item runs on to its end. The pause is kept in the database:
    a restarted server stays paused until resumed."""
    return services.processor.pause()


@router.put("/processor/resume", operation_id="resume_processor")
def resume(queue_id: QueueId, services: AppServices) -> ProcessorStatus:
    return services.processor.resume()
