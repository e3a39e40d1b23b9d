"""The session processor: one worker thread per generation device, each running queue items node by node on its
device. The only place nodes run.

Every worker claims its items from the queue on its own (the queue's claim is atomic, so no item runs twice),
preferring one whose models are already on its device; pause, resume and stop act on all of them, and a cancel
reaches the one running the item (each checks its own item between nodes and steps).
"""

from __future__ import annotations

import base64
import io
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image
from pydantic import BaseModel, Field

from invokeai.app.nodes.base import BaseInvocationOutput, CanceledError, InvocationContext
from invokeai.app.nodes.graph import ValidatedGraph, validate_graph
from invokeai.app.services.database_retry import (
    DATABASE_ERRORS,
    FIRST_DELAY_S,
    DatabaseLostError,
    caused_by_database,
    with_retries,
)
from invokeai.app.services.events import (
    BatchEnqueuedEvent,
    EventBase,
    EventBus,
    InvocationCompleteEvent,
    InvocationErrorEvent,
    InvocationProgressEvent,
    InvocationStartedEvent,
    ProgressImage,
    QueueItemsRetriedEvent,
)
from invokeai.app.services.images import ImageService
from invokeai.app.services.invocation_cache import InvocationCache, cache_key
from invokeai.app.services.model_manager import CachedModel, ModelManager
from invokeai.app.services.queue_models import SessionQueueItem
from invokeai.app.services.session_queue import CANCEL_REASON, SHUTDOWN_REASON, SessionQueue
from invokeai.app.services.tensors import TensorStore
from invokeai.backend.attention import attention_caller

logger = logging.getLogger(__name__)

PREVIEW_MAX_SIDE = 256
# A worker that cannot claim (the database away) looks again after this long at most.
CLAIM_MAX_DELAY_S = 2.0
UNREADABLE_ERROR_TYPE = "UnreadableQueueItem"


class ProcessorStatus(BaseModel):
    is_started: bool = Field(description="The processor takes new items (false while paused or stopped).")
    is_processing: bool = Field(description="An item is running now (on any worker).")
    workers: int = Field(1, description="How many session workers there are (one per generation device).")
    running_item_ids: list[int] = Field(
        default_factory=list, description="The items running now, one per busy worker, oldest first."
    )


class WorkerInfo(BaseModel):
    """One session worker: its device, what it runs now and what it keeps on its device."""

    name: str = Field(description="The worker's name: its device (cuda:1), or cpu#N where several share one.")
    device: str = Field(description="The torch device it runs nodes on, e.g. cuda:1 or cpu.")
    runner: str = Field(description="What it writes into a claimed item's `worker`: <host>:<pid>/<name>.")
    busy: bool = Field(description="Whether it runs an item now.")
    item_id: int | None = Field(description="The item it runs now, or null.")
    queue_id: str | None = Field(description="The queue of that item, or null.")
    items_completed: int = Field(description="Items it has run to completion since the server started.")
    cached_models: list[CachedModel] = Field(
        description="Every model component in the shared RAM cache, and whether this worker's device holds it."
    )


@dataclass
class _Worker:
    name: str
    device: torch.device
    runner: str
    models: ModelManager | None
    wake: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    item: SessionQueueItem | None = None
    items_completed: int = 0


@contextmanager
def _on_device(device: torch.device) -> Iterator[None]:
    """The worker's device as its thread's current CUDA device, so that a bare "cuda" inside a node means it."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            yield
    else:
        yield


def preview_image(image: Image.Image) -> ProgressImage:
    # Once per denoise step: the usual preview is already a small RGB image, so skip the copies.
    small = image if image.mode == "RGB" else image.convert("RGB")
    if max(small.size) > PREVIEW_MAX_SIDE:
        small = small.copy() if small is image else small
        small.thumbnail((PREVIEW_MAX_SIDE, PREVIEW_MAX_SIDE))
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=80)
    data_url = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return ProgressImage(width=small.width, height=small.height, dataURL=data_url)


class SessionProcessor:
    def __init__(
        self,
        queue: SessionQueue,
        images: ImageService,
        events: EventBus,
        models: ModelManager | None = None,
        tensors: TensorStore | None = None,
        workers: list[tuple[str, ModelManager | None]] | None = None,
        poll_seconds: float | None = None,
        cache: InvocationCache | None = None,
    ) -> None:
        """workers: (name, that worker's model manager) for each worker; by default one, on `models`' device.
        poll_seconds: look at the queue at least this often even without a local enqueue (a shared PostgreSQL
        queue gets items, and a resume, from other servers); None: only when woken.
        cache: the invocation cache that nodes with use_cache take their outputs from; None: every node runs."""
        self._queue = queue
        self._images = images
        self._tensors = tensors
        self._cache = cache
        self._events = events
        self._stop = threading.Event()
        # Held around each claim (which reads the pause from the database) and around a pause: a pause waits for a
        # claim under way, so an item enqueued after pause() returns stays pending whichever worker looks.
        self._claiming = threading.Lock()
        self._poll_seconds = poll_seconds
        if workers is None:
            device = models.device if models is not None else torch.device("cpu")
            workers = [(str(device) if ":" in str(device) else f"{device}#0", models)]
        self._workers = [
            _Worker(
                name=name,
                device=manager.device if manager is not None else torch.device("cpu"),
                runner=f"{queue.server}/{name}",
                models=manager,
            )
            for name, manager in workers
        ]
        events.add_listener(
            self._on_enqueued, frozenset({BatchEnqueuedEvent.event_name, QueueItemsRetriedEvent.event_name})
        )

    def _on_enqueued(self, event: EventBase) -> None:
        self.wake()

    def wake(self) -> None:
        """Every worker looks for pending items now: after an enqueue or a resume, or after the relay reconnects
        (an enqueue on another server may have been missed)."""
        for worker in self._workers:
            worker.wake.set()

    # Control, from any thread.

    def start(self) -> None:
        self._stop.clear()
        for worker in self._workers:
            worker.thread = threading.Thread(
                target=self._work, args=(worker,), name=f"session-worker-{worker.name}", daemon=True
            )
            worker.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop taking items; running items are canceled at their next check. Waits up to `timeout` seconds in
        all (the workers stop together, so a stop takes as long as the slowest node, not the sum)."""
        self._stop.set()
        self.wake()
        end = time.monotonic() + timeout
        for worker in self._workers:
            if worker.thread is None:
                continue
            worker.thread.join(max(0.0, end - time.monotonic()))
            if worker.thread.is_alive():
                logger.warning("The node on %s did not stop within %.0f s; leaving it behind", worker.name, timeout)
            worker.thread = None

    def pause(self) -> ProcessorStatus:
        """Take no further items; the running ones (if any) run to their end. Kept in the database: it lasts across
        a restart, and on a shared queue it pauses every server (the claim reads it)."""
        with self._claiming:
            self._queue.set_paused(True)
        return self.status()

    def resume(self) -> ProcessorStatus:
        self._queue.set_paused(False)
        self.wake()
        return self.status()

    def status(self) -> ProcessorStatus:
        alive = any(worker.thread is not None and worker.thread.is_alive() for worker in self._workers)
        running = sorted(worker.item.item_id for worker in self._workers if worker.item is not None)
        return ProcessorStatus(
            is_started=alive and not self._queue.is_paused(),
            is_processing=bool(running),
            workers=len(self._workers),
            running_item_ids=running,
        )

    @property
    def busy(self) -> bool:
        """A worker is running an item now: status().is_processing without its database read (asked often, by the
        warm-up, which yields to real work)."""
        return any(worker.item is not None for worker in self._workers)

    def workers(self) -> list[WorkerInfo]:
        infos = []
        for worker in self._workers:
            item = worker.item  # read once: the worker thread may finish it meanwhile
            infos.append(
                WorkerInfo(
                    name=worker.name,
                    device=str(worker.device),
                    runner=worker.runner,
                    busy=item is not None,
                    item_id=item.item_id if item is not None else None,
                    queue_id=item.queue_id if item is not None else None,
                    items_completed=worker.items_completed,
                    cached_models=worker.models.cached_models() if worker.models is not None else [],
                )
            )
        return infos

    # The worker threads.

    def _work(self, worker: _Worker) -> None:
        with _on_device(worker.device):
            claim_delay = 0.0  # > 0 while the claims fail: the backoff's next wait
            while not self._stop.is_set():
                # Cleared before looking, so an enqueue after the look still wakes the wait below.
                worker.wake.clear()
                try:
                    with self._claiming:
                        item = self._claim(worker)  # None while paused: the claim reads the shared flag
                except DATABASE_ERRORS as error:
                    if not claim_delay:  # one line per outage, not one per try
                        logger.warning(
                            "%s cannot claim queue items, the database is unreachable (%s); retrying",
                            worker.name,
                            type(error).__name__,
                        )
                    claim_delay = min(max(claim_delay * 2, FIRST_DELAY_S), CLAIM_MAX_DELAY_S)
                    self._stop.wait(claim_delay)
                    continue
                except Exception:
                    logger.exception("%s could not take the next queue item", worker.name)
                    self._stop.wait(1.0)  # retry, but not in a tight loop
                    continue
                if claim_delay:
                    logger.info("%s claims queue items again", worker.name)
                    claim_delay = 0.0
                if item is None:
                    worker.wake.wait(self._poll_seconds)
                    continue
                worker.item = item
                logger.debug("Queue item %d runs on %s", item.item_id, worker.name)
                try:
                    if self._run_item(worker, item):
                        worker.items_completed += 1
                except DatabaseLostError as error:
                    # Its end could not be recorded: the lease keeper ends it with the reason once the database
                    # answers (end_dropped), and no node is blamed.
                    logger.error("Queue item %d stopped: %s", item.item_id, error)
                except Exception:
                    # A broken item must not end the worker: log it and go on (the lease keeper ends the item).
                    logger.exception("Queue item %d could not be processed", item.item_id)
                finally:
                    # However it ended: its lease is no longer renewed (one left in_progress is recovered).
                    self._queue.release(item.item_id)
                    worker.item = None

    def _claim(self, worker: _Worker) -> SessionQueueItem | None:
        on_device = worker.models.models_on_device() if worker.models is not None else frozenset()
        return self._queue.dequeue(worker.name, on_device)

    def _is_canceled(self, item_id: int) -> bool:
        """The cancel check; raises DatabaseLostError (a CanceledError: the node stops) when the database stays
        unreachable for a lease."""
        if self._stop.is_set():
            return True
        return not self._retried(lambda: self._queue.is_running(item_id), "the cancel check")

    def _retried(self, call: Callable[[], Any], what: str) -> Any:
        # For up to a lease: by then the item's lease has run out, and another server may have recovered it.
        return with_retries(call, self._queue.lease_seconds, what)

    def _cancel_reason(self) -> str:
        return SHUTDOWN_REASON if self._stop.is_set() else CANCEL_REASON

    def _run_item(self, worker: _Worker, item: SessionQueueItem) -> bool:
        """Run the item to its end; True if it completed."""
        if item.session is None:
            # A damaged row: it fails with the reason, and the worker goes on to the next item.
            logger.warning("Queue item %d cannot be run: %s", item.item_id, item.read_error)
            reason = item.read_error or "unreadable"
            self._retried(lambda: self._queue.fail(item.item_id, UNREADABLE_ERROR_TYPE, reason, "", {}), "its end")
            return False
        graph_json = item.session.graph.model_dump(mode="json")
        workflow = self._retried(lambda: self._queue.workflow_of(item.item_id), "its workflow")
        outputs: dict[str, BaseInvocationOutput] = {}
        results: dict[str, dict[str, Any]] = {}
        try:
            # Validated again (linear time): the order and the incoming-edge index for every node come with it.
            graph = validate_graph(item.session.graph)
            if self._cache is not None:
                self._cache.check_models()
            if graph.order and self._is_canceled(item.item_id):
                raise CanceledError(f"canceled before node {graph.order[0]!r}")
            for node_id in graph.order:
                # Each node ends with a cancel check (before its invocation_complete), which is also the next one's.
                outputs[node_id] = self._run_node(worker, item, graph, graph_json, workflow, node_id, outputs)
                results[node_id] = outputs[node_id].model_dump(mode="json")
        except DatabaseLostError:
            raise
        except CanceledError:
            self._record_end(lambda: self._queue.cancel_running(item.item_id, self._cancel_reason(), results))
        except Exception as error:
            if caused_by_database(error):
                # The database failed the node (it saved an image, read a record): not the node's own error.
                raise DatabaseLostError(f"a database error inside the node: {type(error).__name__}") from error
            if self._is_canceled(item.item_id):
                # A node that noticed the cancel in its own way; the item was canceled, it did not fail.
                self._record_end(lambda: self._queue.cancel_running(item.item_id, self._cancel_reason(), results))
            else:
                self._fail(item, error, results)
        else:
            return bool(self._record_end(lambda: self._queue.complete(item.item_id, results)))
        finally:
            if self._tensors is not None:
                self._tensors.delete_owned(item.session_id)
        return False

    def _run_node(
        self,
        worker: _Worker,
        item: SessionQueueItem,
        graph: ValidatedGraph,
        graph_json: dict[str, Any],
        workflow: str | None,
        node_id: str,
        outputs: dict[str, BaseInvocationOutput],
    ) -> BaseInvocationOutput:
        """Prepare and invoke one node, with its events; the only place a node runs."""
        node_type = graph.graph.nodes[node_id].type
        ids = _ids(item, node_id, node_type, graph_json["nodes"][node_id])
        try:
            node = graph.prepare_node(node_id, outputs)

            def on_progress(step: int, total: int, make_preview: Callable[[], Image.Image] | None) -> None:
                # Unwatched, a step costs nothing here: the preview (a GPU sync and a JPEG) is made for a reader.
                if not self._events.is_wanted(InvocationProgressEvent.event_name, item.queue_id):
                    return
                # Only for a reader here: other servers get the progress without its image (docs/scale.md).
                image = None
                if make_preview is not None and self._events.wants_previews(item.queue_id):
                    image = preview_image(make_preview())
                percentage = step / total if total > 0 else 0.0
                self._events.publish(
                    InvocationProgressEvent(
                        **ids,
                        step=step,
                        total=total,
                        percentage=percentage,
                        # InvokeAI's message for a denoise step: the only progress nodes report here (model_use).
                        message="Denoising",
                        image=image,
                        device=str(worker.device) if worker.device.type == "cuda" else None,
                    )
                )

            context = InvocationContext(
                queue_id=item.queue_id,
                item_id=item.item_id,
                session_id=item.session_id,
                node_id=node_id,
                node_type=node_type,
                graph=graph_json,
                workflow=workflow,
                is_intermediate=node.is_intermediate,
                images=self._images,
                on_progress=on_progress,
                is_canceled=lambda: self._is_canceled(item.item_id),
                models=worker.models,
                tensors=self._tensors,
                fence=self._queue.fence(item.item_id),
            )
            self._events.publish(InvocationStartedEvent(**ids))
            # As InvokeAI's: a node with use_cache takes the output that a node of its type with the same inputs
            # made before, if the cache has it; its events are the same either way.
            cache = self._cache if self._cache is not None and node.use_cache and self._cache.active else None
            key = cache_key(node) if cache is not None else None
            output = cache.get(key, holder=item.session_id) if cache is not None and key is not None else None
            if output is None:
                with attention_caller(node_type, worker.name):
                    output = node.invoke(context)
                if cache is not None and key is not None:
                    cache.save(key, output)
        except CanceledError:
            raise
        except Exception as error:
            if not caused_by_database(error) and not self._is_canceled(item.item_id):
                self._events.publish(InvocationErrorEvent(**ids, **_error_fields(error)))
            raise
        # The run may have lost its item while the node ran (canceled, or recovered from a server cut off past its
        # lease): then it says nothing more, no invocation_complete after the item's canceled.
        if self._is_canceled(item.item_id):
            raise CanceledError(f"canceled while running node {node_id!r} ({node_type})")
        self._events.publish(InvocationCompleteEvent(**ids, result=output))
        return output

    def _fail(self, item: SessionQueueItem, error: Exception, results: dict[str, dict[str, Any]]) -> None:
        fields = _error_fields(error)
        logger.warning("Queue item %d failed: %s: %s", item.item_id, fields["error_type"], fields["error_message"])
        self._record_end(
            lambda: self._queue.fail(
                item.item_id, fields["error_type"], fields["error_message"], fields["error_traceback"], results
            )
        )

    def _record_end(self, record: Callable[[], bool]) -> bool:
        """Record the item's end, retried while the database is away (DatabaseLostError when it stays away)."""
        return bool(self._retried(record, "recording its end"))


def _ids(item: SessionQueueItem, node_id: str, node_type: str, invocation: dict[str, Any]) -> dict[str, Any]:
    return {
        "queue_id": item.queue_id,
        "item_id": item.item_id,
        "batch_id": item.batch_id,
        "session_id": item.session_id,
        "origin": item.origin,
        "destination": item.destination,
        "node_id": node_id,
        "node_type": node_type,
        "invocation": invocation,
    }


def _error_fields(error: BaseException) -> dict[str, str]:
    return {
        "error_type": type(error).__name__,
        "error_message": str(error),
        "error_traceback": "".join(traceback.format_exception(error)),
    }
