"""GET /api/v1/queue/{queue_id}/events: the queue's events as Server-Sent Events (docs/api.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent

from invokeai.app.api.routers.queue import QueueId
from invokeai.app.services.events import AnyEvent, EventBus, Subscription

router = APIRouter(prefix="/queue/{queue_id}", tags=["events"])


async def _subscription(queue_id: QueueId, request: Request) -> AsyncIterator[Subscription]:
    # A dependency runs before the response starts: once a client has the response headers, it is subscribed, and
    # every event published after that reaches it. The exit runs when the response is over.
    bus: EventBus = request.app.state.events
    subscription = bus.subscribe(queue_id)
    try:
        yield subscription
    finally:
        bus.unsubscribe(subscription)


# The annotation is what the OpenAPI document shows as each event's data; the generator yields ServerSentEvents
# (which FastAPI passes through unvalidated) to add the `event:` line.
@router.get("/events", operation_id="queue_events", response_class=EventSourceResponse)
async def queue_events(
    queue_id: QueueId, subscription: Annotated[Subscription, Depends(_subscription)]
) -> AsyncIterator[AnyEvent]:
    """Every event of the queue from the moment the response headers are sent, in order, as `event: <name>` and
    `data: <JSON payload>`.

    The stream ends when the server stops, or when the client falls 1000 events behind (reconnect and re-read the
    queue). While idle, the server sends a comment line every 15 s.
    """
    while (event := await subscription.next()) is not None:
        yield ServerSentEvent(event=event.event_name, raw_data=event.model_dump_json())  # type: ignore[misc]
