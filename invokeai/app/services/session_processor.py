"""The session processor: a worker thread that runs queue items, node by node. The only place nodes run."""

from __future__ import annotations

import base64
import io
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from PIL import Image
from pydantic import BaseModel, Field

from invokeai.app.nodes.base import BaseInvocationOutput, CanceledError, InvocationContext
from invokeai.app.nodes.graph import ValidatedGraph, validate_graph
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
from invokeai.app.services.model_manager import ModelManager
from invokeai.app.services.queue_models import SessionQueueItem
from invokeai.app.services.session_queue import CANCEL_REASON, SHUTDOWN_REASON, SessionQueue
from invokeai.app.services.tensors import TensorStore
from invokeai.backend.attention import attention_caller

logger = logging.getLogger(__name__)

PREVIEW_MAX_SIDE = 256
UNREADABLE_ERROR_TYPE = "UnreadableQueueItem"


class ProcessorStatus(BaseModel):
    is_started: bool = Field(description="The processor takes new items (false while paused or stopped).")
    is_processing: bool = Field(description="An item is running now.")


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
        poll_seconds: float | None = None,
    ) -> None:
        """poll_seconds: look at the queue at least this often even without a local enqueue (a shared PostgreSQL
        queue gets items, and a resume, from other servers); None: only when woken."""
        self._queue = queue
        self._images = images
        self._models = models
        self._tensors = tensors
        self._events = events
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._poll_seconds = poll_seconds
        self._running_item: int | None = None
        self._thread: threading.Thread | None = None
        events.add_listener(
            self._on_enqueued, frozenset({BatchEnqueuedEvent.event_name, QueueItemsRetriedEvent.event_name})
        )

    def _on_enqueued(self, event: EventBase) -> None:
        self._wake.set()

    def wake(self) -> None:
        """Look for pending items now: after the relay reconnects, an enqueue on another server may have been
        missed."""
        self._wake.set()

    # Control, from any thread.

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._work, name="session-processor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop taking items; a running item is canceled at its next check. Waits up to `timeout` seconds."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("The running node did not stop within %.0f s; leaving it behind", timeout)
            self._thread = None

    def pause(self) -> ProcessorStatus:
        """Take no further items; the running one (if any) runs to its end. Kept in the database: it lasts across a
        restart, and on a shared queue it pauses every server (the claim reads it)."""
        self._queue.set_paused(True)
        return self.status()

    def resume(self) -> ProcessorStatus:
        self._queue.set_paused(False)
        self._wake.set()
        return self.status()

    def status(self) -> ProcessorStatus:
        started = self._thread is not None and self._thread.is_alive() and not self._queue.is_paused()
        return ProcessorStatus(is_started=started, is_processing=self._running_item is not None)

    # The worker thread.

    def _work(self) -> None:
        while not self._stop.is_set():
            # Cleared before looking, so an enqueue after the look still wakes the wait below.
            self._wake.clear()
            try:
                item = self._queue.dequeue()  # None while paused: the claim reads the shared flag
            except Exception:
                logger.exception("Could not take the next queue item")
                self._stop.wait(1.0)  # database trouble: retry, but not in a tight loop
                continue
            if item is None:
                self._wake.wait(self._poll_seconds)
                continue
            self._running_item = item.item_id
            try:
                self._run_item(item)
            except Exception:
                # A broken item (or database trouble) must not end the worker: log it and go on.
                logger.exception("Queue item %d could not be processed", item.item_id)
            finally:
                self._running_item = None

    def _is_canceled(self, item_id: int) -> bool:
        return self._stop.is_set() or not self._queue.is_running(item_id)

    def _cancel_reason(self) -> str:
        return SHUTDOWN_REASON if self._stop.is_set() else CANCEL_REASON

    def _run_item(self, item: SessionQueueItem) -> None:
        if item.session is None:
            # A damaged row: it fails with the reason, and the worker goes on to the next item.
            logger.warning("Queue item %d cannot be run: %s", item.item_id, item.read_error)
            self._queue.fail(item.item_id, UNREADABLE_ERROR_TYPE, item.read_error or "unreadable", "", {})
            return
        graph_json = item.session.graph.model_dump(mode="json")
        outputs: dict[str, BaseInvocationOutput] = {}
        results: dict[str, dict[str, Any]] = {}
        try:
            # Validated again (linear time): the order and the incoming-edge index for every node come with it.
            graph = validate_graph(item.session.graph)
            for node_id in graph.order:
                if self._is_canceled(item.item_id):
                    raise CanceledError(f"canceled before node {node_id!r}")
                outputs[node_id] = self._run_node(item, graph, graph_json, node_id, outputs)
                results[node_id] = outputs[node_id].model_dump(mode="json")
        except CanceledError:
            self._queue.cancel_running(item.item_id, self._cancel_reason(), results)
        except Exception as error:
            if self._is_canceled(item.item_id):
                # A node that noticed the cancel in its own way; the item was canceled, it did not fail.
                self._queue.cancel_running(item.item_id, self._cancel_reason(), results)
            else:
                self._fail(item, error, results)
        else:
            self._queue.complete(item.item_id, results)
        finally:
            if self._tensors is not None:
                self._tensors.delete_owned(item.session_id)

    def _run_node(
        self,
        item: SessionQueueItem,
        graph: ValidatedGraph,
        graph_json: dict[str, Any],
        node_id: str,
        outputs: dict[str, BaseInvocationOutput],
    ) -> BaseInvocationOutput:
        """Prepare and invoke one node, with its events; the only place a node runs."""
        node_type = graph.graph.nodes[node_id].type
        ids = _ids(item, node_id, node_type)
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
                    InvocationProgressEvent(**ids, step=step, total=total, percentage=percentage, image=image)
                )

            context = InvocationContext(
                queue_id=item.queue_id,
                item_id=item.item_id,
                session_id=item.session_id,
                node_id=node_id,
                node_type=node_type,
                graph=graph_json,
                images=self._images,
                on_progress=on_progress,
                is_canceled=lambda: self._is_canceled(item.item_id),
                models=self._models,
                tensors=self._tensors,
            )
            self._events.publish(InvocationStartedEvent(**ids))
            with attention_caller(node_type):
                output = node.invoke(context)
        except CanceledError:
            raise
        except Exception as error:
            if not self._is_canceled(item.item_id):
                self._events.publish(InvocationErrorEvent(**ids, **_error_fields(error)))
            raise
        self._events.publish(InvocationCompleteEvent(**ids, result=output))
        return output

    def _fail(self, item: SessionQueueItem, error: Exception, results: dict[str, dict[str, Any]]) -> None:
        fields = _error_fields(error)
        logger.warning("Queue item %d failed: %s: %s", item.item_id, fields["error_type"], fields["error_message"])
        self._queue.fail(
            item.item_id, fields["error_type"], fields["error_message"], fields["error_traceback"], results
        )


def _ids(item: SessionQueueItem, node_id: str, node_type: str) -> dict[str, Any]:
    return {
        "queue_id": item.queue_id,
        "item_id": item.item_id,
        "batch_id": item.batch_id,
        "session_id": item.session_id,
        "node_id": node_id,
        "node_type": node_type,
    }


def _error_fields(error: BaseException) -> dict[str, str]:
    return {
        "error_type": type(error).__name__,
        "error_message": str(error),
        "error_traceback": "".join(traceback.format_exception(error)),
    }
