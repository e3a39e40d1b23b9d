"""GET /api/v1/queue/{queue_id}/events: the queue's events as Server-Sent Events (docs/api.md).

A plain streaming response writes the frames. FastAPI's EventSourceResponse would pass every event through a
producer task, two memory streams and a timeout scope: about eight event-loop turns per event against two here, and
each turn takes the GIL from the worker thread that runs the nodes, so a watched SD demo generation ran about 6%
longer (alternating pairs of items on one server, docs/api.md). `describe_stream_items` gives the OpenAPI document
the stream's item schema that FastAPI would have written.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from invokeai.app.api.json_body import ApiRoute
from invokeai.app.api.routers.queue import QueueId
from invokeai.app.services.events import EVENT_NAMES, AnyEvent, EventBase, EventBus, EventName, Subscription

router = APIRouter(prefix="/queue/{queue_id}", tags=["events"], route_class=ApiRoute)

OPERATION_ID = "queue_events"
MEDIA_TYPE = "text/event-stream"
# A comment line while idle, so that proxies and clients with read timeouts keep the connection open.
KEEPALIVE_SECONDS = 15.0
KEEPALIVE = b": ping\n\n"
# no-cache: the stream is live. X-Accel-Buffering: nginx would otherwise hold events back in its buffer.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_frame(event: EventBase) -> bytes:
    """`event: <name>` and `data: <JSON>`; pydantic's JSON has no raw line break, so the data is one line."""
    return f"event: {event.event_name}\ndata: {event.model_dump_json()}\n\n".encode()


EventFilter = Annotated[
    list[EventName] | None,
    Query(
        description="Only events of this name; repeat it for more than one. Without it, every event of the queue. "
        "A stream without invocation_progress also spares the server each denoise step's preview."
    ),
]


async def _subscription(queue_id: QueueId, request: Request, event: EventFilter = None) -> AsyncIterator[Subscription]:
    # A dependency runs before the response starts: once a client has the response headers, it is subscribed, and
    # every event published after that reaches it. Its exit runs when the response is over, also when the client
    # goes away (Starlette listens for the disconnect; where the server leaves that out, the next write fails).
    bus: EventBus = request.app.state.events
    subscription = bus.subscribe(queue_id, None if event is None else frozenset(event))
    try:
        yield subscription
    finally:
        bus.unsubscribe(subscription)


async def _frames(subscription: Subscription) -> AsyncIterator[bytes]:
    while True:
        try:
            async with asyncio.timeout(KEEPALIVE_SECONDS):
                event = await subscription.next()
        except TimeoutError:
            # The wait was canceled before it took anything: no event is lost.
            yield KEEPALIVE
            continue
        if event is None:
            return
        yield sse_frame(event)


class EventStreamResponse(StreamingResponse):
    media_type = MEDIA_TYPE


# The payload model is named here for the OpenAPI document only (FastAPI adds the events to its components);
# describe_stream_items then moves it to where a stream's items are described.
@router.get(
    "/events",
    operation_id=OPERATION_ID,
    response_class=EventStreamResponse,
    responses={200: {"model": AnyEvent, "description": "The event stream."}},
)
async def queue_events(
    queue_id: QueueId, subscription: Annotated[Subscription, Depends(_subscription)]
) -> EventStreamResponse:
    """Every event of the queue (or those named by `event`) from the moment the response headers are sent, in
    order, as `event: <name>` and `data: <JSON payload>`.

    The stream ends when the server stops, or when the client falls 1000 events behind (reconnect and re-read the
    queue). While idle, the server sends a comment line every 15 s.
    """
    return EventStreamResponse(_frames(subscription), headers=STREAM_HEADERS)


def describe_stream_items(document: dict[str, Any]) -> None:
    """Describe the stream's items as OpenAPI 3.2's itemSchema (as FastAPI writes it for its own event streams):
    the event name, and the payload's schema, whose events are among the components."""
    for operations in document["paths"].values():
        for operation in operations.values():
            if operation.get("operationId") != OPERATION_ID:
                continue
            content = operation["responses"]["200"]["content"]
            payload = content[MEDIA_TYPE].pop("schema")
            content[MEDIA_TYPE]["itemSchema"] = {
                "type": "object",
                "properties": {
                    "event": {"type": "string", "enum": list(EVENT_NAMES)},
                    "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": payload},
                },
                "required": ["event", "data"],
            }
