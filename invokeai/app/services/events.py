"""Events: one pydantic payload model per event name, and the bus that carries them to subscribers.

Publishers are the session queue, the session processor and the model installer, on any thread. Subscribers are the
event stream (one per connected client, on the server's event loop), the Socket.IO server (a sink: one for all its
clients) and in-process listeners such as the processor.

Where InvokeAI 6.14.2 has an event of the same name, the payload carries every field InvokeAI requires, with its
meaning (docs/api.md); this server's own fields (`node_id`, `step`, `worker`, ...) come beside them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, computed_field

from invokeai.app.services.model_configs import ModelConfig
from invokeai.app.services.model_install_jobs import LocalModelSource
from invokeai.app.services.queue_models import AnyInvocationOutput, QueueItemStatus

logger = logging.getLogger(__name__)


# This server has one user; InvokeAI names the owner of everything in a single-user server so.
SYSTEM_USER = "system"


def _now() -> int:
    return int(time.time())


class EventBase(BaseModel):
    # Every field is in every payload: the OpenAPI document says so (as InvokeAI's does), defaults or not.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    event_name: ClassVar[str]

    timestamp: int = Field(
        default_factory=_now, description="When the server sent the event: whole seconds since 1970 (UTC), as InvokeAI."
    )
    queue_id: str


class QueueItemEventBase(EventBase):
    item_id: int
    batch_id: str
    session_id: str
    origin: str | None = Field(None, description="The batch's origin, as sent.")
    destination: str | None = Field(None, description="The batch's destination, as sent.")
    user_id: str = Field(SYSTEM_USER, description="Who enqueued the item: always 'system' (one user).")


class BatchStatusCounts(BaseModel):
    """A batch's items per status, as InvokeAI's BatchStatus."""

    queue_id: str
    batch_id: str
    origin: str | None
    destination: str | None
    pending: int
    in_progress: int
    waiting: int
    completed: int
    failed: int
    canceled: int
    total: int


class QueueStatusCounts(BaseModel):
    """A queue's items per status and its current item, as InvokeAI's SessionQueueStatus."""

    queue_id: str
    item_id: int | None = Field(description="The item in progress, if any (the oldest, with several workers).")
    batch_id: str | None
    session_id: str | None
    pending: int
    in_progress: int
    waiting: int
    completed: int
    failed: int
    canceled: int
    total: int
    user_pending: int | None = Field(None, description="InvokeAI's per-user count: null, as for its admins.")
    user_in_progress: int | None = Field(None, description="InvokeAI's per-user count: null, as for its admins.")


class QueueItemStatusChangedEvent(QueueItemEventBase):
    """A queue item changed status (pending -> in_progress -> completed, failed or canceled)."""

    event_name: ClassVar[str] = "queue_item_status_changed"

    status: QueueItemStatus
    status_sequence: int | None = Field(None, description="InvokeAI's status version: null here.")
    error_type: str | None = None
    error_message: str | None = None
    error_traceback: str | None = None
    cancel_reason: str | None = None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    worker: str | None = Field(
        None, description="Who runs (or ran) the item, as the queue item's `worker`: `<host>:<pid>/<worker>`."
    )
    batch_status: BatchStatusCounts = Field(description="The item's batch, just after the change.")
    queue_status: QueueStatusCounts = Field(description="The item's queue, just after the change.")


class InvocationEventBase(QueueItemEventBase):
    node_id: str = Field(description="The node's id in the graph.")
    node_type: str = Field(description="The node's type, e.g. blank_image.")
    invocation: dict[str, Any] = Field(description="The node, as in the item's graph (InvokeAI's invocation).")

    # Prepared node ids are the graph's own here (no iterate expansion), so the source id is the node id.
    @computed_field(description="The node's id in the graph that was enqueued (InvokeAI's source node id).")  # type: ignore[prop-decorator]
    @property
    def invocation_source_id(self) -> str:
        return self.node_id


class InvocationStartedEvent(InvocationEventBase):
    """A node started running."""

    event_name: ClassVar[str] = "invocation_started"


class ProgressImage(BaseModel):
    width: int
    height: int
    dataURL: str = Field(description="The preview as a data: URL (JPEG), at most 256 pixels on its longer side.")


class InvocationProgressEvent(InvocationEventBase):
    """A running node finished a step."""

    event_name: ClassVar[str] = "invocation_progress"

    step: int = Field(description="Steps done so far.")
    total: int = Field(description="Steps in all.")
    percentage: float = Field(description="step / total, from 0 to 1.")
    message: str = Field(description="What the node is doing, e.g. 'Denoising' (InvokeAI's progress message).")
    image: ProgressImage | None = Field(None, description="A small preview of the node's current result, if any.")
    device: str | None = Field(None, description="The GPU running the node, e.g. cuda:1; null on the CPU.")


class InvocationCompleteEvent(InvocationEventBase):
    """A node returned; `result` is its output."""

    event_name: ClassVar[str] = "invocation_complete"

    result: AnyInvocationOutput = Field(description="The node's output, as in the item's session results.")  # type: ignore[valid-type]


class InvocationErrorEvent(InvocationEventBase):
    """A node raised; its queue item fails."""

    event_name: ClassVar[str] = "invocation_error"

    error_type: str = Field(description="The exception's class name.")
    error_message: str
    error_traceback: str


class BatchEnqueuedEvent(EventBase):
    """A batch was added to the queue."""

    event_name: ClassVar[str] = "batch_enqueued"

    batch_id: str
    enqueued: int
    requested: int
    priority: int
    origin: str | None = Field(None, description="The batch's origin, as sent.")
    user_id: str = Field(SYSTEM_USER, description="Who enqueued the batch: always 'system' (one user).")


def _by_user(item_ids: list[int]) -> dict[str, list[int]]:
    return {SYSTEM_USER: item_ids} if item_ids else {}


class QueueItemsCanceledEvent(EventBase):
    """Several items were canceled by one request (cancel_by_batch_ids, clear, or a restart after a crash): one
    event for all of them, so that a bulk cancel cannot outrun a client reading the stream."""

    event_name: ClassVar[str] = "queue_items_canceled"

    item_ids: list[int] = Field(description="The items now canceled (pending or running before).")
    batch_ids: list[str] = Field(description="Their batches, each once.")
    cancel_reason: str

    # InvokeAI's names for the same items (it has users; this server's one user is 'system').
    @computed_field(description="The same as item_ids (InvokeAI's name).")  # type: ignore[prop-decorator]
    @property
    def canceled_item_ids(self) -> list[int]:
        return self.item_ids

    @computed_field(description="The items' owners: 'system', if any item.")  # type: ignore[prop-decorator]
    @property
    def user_ids(self) -> list[str]:
        return [SYSTEM_USER] if self.item_ids else []

    @computed_field(description="item_ids under their owner, 'system'.")  # type: ignore[prop-decorator]
    @property
    def canceled_item_ids_by_user(self) -> dict[str, list[int]]:
        return _by_user(self.item_ids)


class QueueClearedEvent(EventBase):
    """Every item of the queue was deleted (a running one was canceled first: see queue_items_canceled)."""

    event_name: ClassVar[str] = "queue_cleared"

    deleted: int
    user_id: str | None = Field(None, description="Null: every user's items were deleted (InvokeAI's meaning).")


class QueuePrunedEvent(EventBase):
    """The queue's finished (completed, failed and canceled) items were deleted."""

    event_name: ClassVar[str] = "queue_pruned"

    deleted: int


class QueueItemsRetriedEvent(EventBase):
    """Failed or canceled items were enqueued again as new pending items."""

    event_name: ClassVar[str] = "queue_items_retried"

    retried_item_ids: list[int] = Field(description="The original items.")
    item_ids: list[int] = Field(description="The new pending items, in the same order.")

    @computed_field(description="The items' owners: 'system', if any item.")  # type: ignore[prop-decorator]
    @property
    def user_ids(self) -> list[str]:
        return [SYSTEM_USER] if self.retried_item_ids else []

    @computed_field(description="retried_item_ids under their owner, 'system'.")  # type: ignore[prop-decorator]
    @property
    def retried_item_ids_by_user(self) -> dict[str, list[int]]:
        return _by_user(self.retried_item_ids)


class ModelEventBase(EventBase):
    """Model events concern the whole server rather than one queue: every queue's stream gets them."""

    queue_id: str | None = Field(None, description="Always null: a model event is sent on every queue's stream.")  # type: ignore[assignment]


class ModelInstallEventBase(ModelEventBase):
    id: int = Field(description="The install job's id (GET /api/v2/models/install/{id}).")
    source: LocalModelSource = Field(description="What is installed.")


class ModelInstallStartedEvent(ModelInstallEventBase):
    """An install job started: its source is being probed, then copied (or recorded in place) and hashed."""

    event_name: ClassVar[str] = "model_install_started"


class ModelInstallProgressEvent(ModelInstallEventBase):
    """An install copied (or hashed) some more bytes; sent at most twice a second, and at the start and end of the
    files. This server's own event: InvokeAI reports progress only of downloads (model_install_download_progress)."""

    event_name: ClassVar[str] = "model_install_progress"

    bytes: int = Field(description="Bytes copied or hashed so far.")
    total_bytes: int = Field(description="Bytes of the model's files.")


class ModelInstallCompleteEvent(ModelInstallEventBase):
    """A model was installed; `key` names its record and `config` is the record."""

    event_name: ClassVar[str] = "model_install_complete"

    key: str = Field(description="The model's key.")
    total_bytes: int | None = Field(description="Bytes of the model's files.")
    config: ModelConfig = Field(description="The installed model's record.")


class ModelInstallCancelledEvent(ModelInstallEventBase):
    """An install job was cancelled; nothing of it was kept."""

    event_name: ClassVar[str] = "model_install_cancelled"


class ModelInstallErrorEvent(ModelInstallEventBase):
    """An install failed; nothing of it was kept."""

    event_name: ClassVar[str] = "model_install_error"

    error_type: str = Field(description="The exception's class name.")
    error: str = Field(description="What went wrong.")


class ModelLoadEventBase(ModelEventBase):
    config: ModelConfig = Field(description="The model's record.")
    submodel_type: str | None = Field(
        default=None, description="The component loaded (unet, transformer, text_encoder, vae ...)."
    )
    user_id: str = Field(default="system", description="Always system (this server has one user).")


class ModelLoadStartedEvent(ModelLoadEventBase):
    """A model component is being read from disk into the RAM cache (not sent when the cache has it already)."""

    event_name: ClassVar[str] = "model_load_started"


class ModelLoadCompleteEvent(ModelLoadEventBase):
    """A model component was read from disk into the RAM cache."""

    event_name: ClassVar[str] = "model_load_complete"


EVENT_TYPES: tuple[type[EventBase], ...] = (
    QueueItemStatusChangedEvent,
    InvocationStartedEvent,
    InvocationProgressEvent,
    InvocationCompleteEvent,
    InvocationErrorEvent,
    BatchEnqueuedEvent,
    QueueItemsCanceledEvent,
    QueueClearedEvent,
    QueuePrunedEvent,
    QueueItemsRetriedEvent,
    ModelInstallProgressEvent,
    ModelInstallCompleteEvent,
    ModelInstallErrorEvent,
    ModelInstallStartedEvent,
    ModelInstallCancelledEvent,
    ModelLoadStartedEvent,
    ModelLoadCompleteEvent,
)
EVENT_NAMES: tuple[str, ...] = tuple(event.event_name for event in EVENT_TYPES)
# The same names, for validating a request that names events (a test keeps the two equal).
EventName = Literal[
    "queue_item_status_changed",
    "invocation_started",
    "invocation_progress",
    "invocation_complete",
    "invocation_error",
    "batch_enqueued",
    "queue_items_canceled",
    "queue_cleared",
    "queue_pruned",
    "queue_items_retried",
    "model_install_progress",
    "model_install_complete",
    "model_install_error",
    "model_install_started",
    "model_install_cancelled",
    "model_load_started",
    "model_load_complete",
]

# For the OpenAPI document: the payload of any event. The SSE `event:` line names which one it is.
AnyEvent = Annotated[
    QueueItemStatusChangedEvent
    | InvocationStartedEvent
    | InvocationProgressEvent
    | InvocationCompleteEvent
    | InvocationErrorEvent
    | BatchEnqueuedEvent
    | QueueItemsCanceledEvent
    | QueueClearedEvent
    | QueuePrunedEvent
    | QueueItemsRetriedEvent
    | ModelInstallProgressEvent
    | ModelInstallCompleteEvent
    | ModelInstallErrorEvent
    | ModelInstallStartedEvent
    | ModelInstallCancelledEvent
    | ModelLoadStartedEvent
    | ModelLoadCompleteEvent,
    Field(description="The payload of one event; the stream's `event:` line says which."),
]

Listener = Callable[[EventBase], None]
# The event names a subscriber or listener takes; None: all of them.
EventNames = frozenset[str] | None


def _named(names: EventNames, event_name: str) -> bool:
    return names is None or event_name in names


_END = None  # queued last in a subscription: its stream is over


class EventSink(Protocol):
    """A transport that takes the events of many queues for its own clients (the Socket.IO server), attached to
    the bus for as long as the server runs. It says which events it would deliver now (`takes`), so that nobody's
    absence still costs a denoise step its preview; the bus hands it those events under its lock, in publication
    order, from the publishing thread."""

    def takes(self, event_name: str, queue_id: str | None) -> bool: ...

    def deliver(self, event: EventBase) -> None:
        """Must return at once (hand the event to the sink's own loop)."""
        ...

    def streams_ended(self) -> None:
        """Events may have been lost (as end_streams), or the bus closed: the sink ends its clients' connections."""
        ...


class Subscription:
    """One client's events from one queue (all of them, or those named in `names`), handed from the publishing
    threads to the subscriber's event loop.

    Bounded: a client that falls `max_pending` events behind is disconnected (its stream ends) rather than
    silently skipping events, so a connected client can trust that it has seen every event, in order. It
    reconnects and re-reads the queue over REST to catch up.
    """

    def __init__(self, queue_id: str, max_pending: int, names: EventNames = None) -> None:
        self.queue_id = queue_id
        self.names = names
        self.overflowed = False
        self._max_pending = max_pending
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[EventBase | None] = asyncio.Queue()
        self._ended = False

    def takes(self, event_name: str, queue_id: str | None) -> bool:
        # queue_id None: a server-wide event (a model install), for every stream.
        return queue_id in (None, self.queue_id) and _named(self.names, event_name)

    async def next(self) -> EventBase | None:
        """The next event, or None once the stream has ended."""
        return await self._events.get()

    def deliver(self, event: EventBase | None) -> bool:
        """From any thread; False when the subscriber's loop is gone (the subscription is then dead)."""
        try:
            self._loop.call_soon_threadsafe(self._put, event)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def _put(self, event: EventBase | None) -> None:
        if self._ended:
            return
        if event is not _END and self._events.qsize() >= self._max_pending:
            self.overflowed = True
            logger.warning(
                "An event stream of queue %r fell %d events behind; ending it", self.queue_id, self._max_pending
            )
            event = _END
        self._events.put_nowait(event)
        self._ended = event is _END


class EventBus:
    def __init__(self, max_pending: int = 1000) -> None:
        self._lock = threading.Lock()
        self._subscriptions: list[Subscription] = []
        self._sinks: list[EventSink] = []
        # (listener, names, forwards): a forwarding listener (the relay to other servers) passes events on rather
        # than showing them, so it does not ask for step previews (wants_previews).
        self._listeners: list[tuple[Listener, EventNames, bool]] = []
        self._max_pending = max_pending
        self._closed = False

    def publish(self, event: EventBase) -> None:
        """Send `event` to its queue's subscribers and to every listener. Safe from any thread."""
        name = event.event_name
        with self._lock:
            listeners = [listener for listener, names, _ in self._listeners if _named(names, name)]
            targets = [sub for sub in self._subscriptions if sub.takes(name, event.queue_id)]
            # Delivered under the lock: two threads publishing at once still reach every subscriber in one order.
            dead = [sub for sub in targets if not sub.deliver(event)]
            for sub in dead:
                self._subscriptions.remove(sub)
            for sink in self._sinks:
                if sink.takes(name, event.queue_id):
                    sink.deliver(event)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("Event listener %r failed on %s", listener, event.event_name)

    def add_listener(self, listener: Listener, names: EventNames = None, *, forwards: bool = False) -> None:
        """Call `listener(event)` on the publishing thread for every event (or every event named in `names`); it
        must return quickly. `forwards`: the listener sends events on to other servers, which never get a step's
        preview image (see wants_previews)."""
        with self._lock:
            self._listeners.append((listener, names, forwards))

    def subscribe(self, queue_id: str, names: EventNames = None) -> Subscription:
        """From the event loop that will read the subscription (of every event of the queue, or those named in
        `names`). After close(), the stream ends at once."""
        subscription = Subscription(queue_id, self._max_pending, names)
        with self._lock:
            if self._closed:
                subscription.deliver(_END)
            else:
                self._subscriptions.append(subscription)
        return subscription

    def attach(self, sink: EventSink) -> None:
        """Deliver the events `sink` takes to it, from now until detach(). After close(), it is told at once."""
        with self._lock:
            if self._closed:
                sink.streams_ended()
            else:
                self._sinks.append(sink)

    def detach(self, sink: EventSink) -> None:
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)

    def is_wanted(self, event_name: str, queue_id: str | None) -> bool:
        """Whether an event of that name and queue, published now, would reach any subscriber or listener: a
        publisher skips building what nobody takes (a denoise step's preview and progress event)."""
        with self._lock:
            return (
                any(_named(names, event_name) for _, names, _ in self._listeners)
                or any(sub.takes(event_name, queue_id) for sub in self._subscriptions)
                or any(sink.takes(event_name, queue_id) for sink in self._sinks)
            )

    def wants_previews(self, queue_id: str) -> bool:
        """Whether a step's preview image would reach anyone here: a subscriber or a listener of this server. The
        relay to other servers sends progress without the image, so it alone is not worth a preview's GPU sync
        and JPEG."""
        name = InvocationProgressEvent.event_name
        with self._lock:
            return (
                any(_named(names, name) for _, names, forwards in self._listeners if not forwards)
                or any(sub.takes(name, queue_id) for sub in self._subscriptions)
                or any(sink.takes(name, queue_id) for sink in self._sinks)
            )

    @property
    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._subscriptions)

    def end_streams(self) -> None:
        """End every stream now, as an overflow would, and go on taking new ones: after events may have been lost
        (the relay lost its connection), a client reconnects and re-reads the queue rather than trusting a stream
        with a hole in it."""
        with self._lock:
            for sub in self._subscriptions:
                sub.deliver(_END)
            self._subscriptions.clear()
            for sink in self._sinks:  # they stay attached: their clients reconnect
                sink.streams_ended()

    def close(self) -> None:
        """End every stream (at shutdown: the server waits for open responses before it stops)."""
        with self._lock:
            self._closed = True
            for sub in self._subscriptions:
                sub.deliver(_END)
            self._subscriptions.clear()
            for sink in self._sinks:
                sink.streams_ended()
            self._sinks.clear()
