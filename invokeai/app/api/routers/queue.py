"""/api/v1/queue/{queue_id}: enqueue batches, read and cancel items, counts, clear, prune, pause and resume."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status
from pydantic import BaseModel, Field

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.services.queue_models import (
    ID_PATTERN,
    MAX_SQL_INT,
    EnqueueBatchBody,
    EnqueueBatchResult,
    QueueCounts,
    QueueItemStatus,
    RetryItemsByIdBody,
    RetryItemsResult,
    SessionQueueItem,
    SessionQueueItemPage,
)
from invokeai.app.services.session_processor import ProcessorStatus
from invokeai.app.services.session_queue import RetryRefusedError

router = APIRouter(prefix="/queue/{queue_id}", tags=["queue"], route_class=ApiRoute)

QueueId = Annotated[str, Path(description="The queue's id; InvokeAI's clients use 'default'.", pattern=ID_PATTERN)]
ItemId = Annotated[int, Path(description="The queue item's id.", ge=1, le=MAX_SQL_INT)]

BATCH_INVALID_RESPONSE = {
    422: {"description": "The body is malformed, or a graph or batch datum is invalid (detail names which and why)."}
}


class QueueAndProcessorStatus(BaseModel):
    queue: QueueCounts
    processor: ProcessorStatus


class CancelByBatchIdsBody(BaseModel):
    batch_ids: list[str] = Field(description="Cancel every pending or running item of these batches.", max_length=1000)


class CancelByBatchIdsResult(BaseModel):
    canceled: int = Field(description="How many items were canceled.")


class DeletedResult(BaseModel):
    deleted: int = Field(description="How many items were deleted.")


@router.post(
    "/enqueue_batch",
    operation_id="enqueue_batch",
    status_code=status.HTTP_201_CREATED,
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
def retry_items_by_id(queue_id: QueueId, body: RetryItemsByIdBody, services: AppServices) -> RetryItemsResult:
    """Enqueue each failed or canceled item again as a new pending item, with the same graph, batch data and
    priority, and `retried_from_item_id` naming the original (which stays as it is). All or none."""
    try:
        return services.queue.retry_items_by_id(queue_id, body.item_ids)
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
def get_status(queue_id: QueueId, services: AppServices) -> QueueAndProcessorStatus:
    """Items per status, the running item, and whether the processor takes items."""
    return QueueAndProcessorStatus(queue=services.queue.status(queue_id), processor=services.processor.status())


@router.put("/processor/pause", operation_id="pause_processor")
def pause(queue_id: QueueId, services: AppServices) -> ProcessorStatus:
    """Take no new items (for every queue); the running item runs on to its end. The pause is kept in the database:
    a restarted server stays paused until resumed."""
    return services.processor.pause()


@router.put("/processor/resume", operation_id="resume_processor")
def resume(queue_id: QueueId, services: AppServices) -> ProcessorStatus:
    return services.processor.resume()
