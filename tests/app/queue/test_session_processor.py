"""The session processor: runs items node by node inside attention_caller, with events, failures and cancels."""

from __future__ import annotations

import json
import time

import pytest
from PIL import Image
from queue_support import EventRecorder, graph, image_batch, integer_batch, wait_until

from invokeai.app.nodes.base import InvocationContext
from invokeai.app.nodes.primitives import IntegerInvocation, IntegerOutput
from invokeai.app.services.events import EventBase, EventBus, InvocationErrorEvent, InvocationProgressEvent
from invokeai.app.services.images import GRAPH_KEY, ImageService
from invokeai.app.services.queue_models import Batch
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import CANCEL_REASON, SHUTDOWN_REASON, SessionQueue


def test_an_item_runs_in_dependency_order_with_events(
    processor: SessionProcessor, queue: SessionQueue, recorder: EventRecorder, images: ImageService
) -> None:
    [item_id] = queue.enqueue_batch("default", image_batch()).item_ids
    assert recorder.wait_status(item_id, "completed", "failed") == "completed"
    assert recorder.names(item_id) == [
        "queue_item_status_changed",
        "invocation_started",
        "invocation_complete",
        "invocation_started",
        "invocation_complete",
        "queue_item_status_changed",
    ]
    nodes = [getattr(event, "node_id", None) for event in recorder.of_item(item_id)]
    assert nodes == [None, "blank", "blank", "resize", "resize", None]
    item = queue.get("default", item_id)
    resized = item.session.results["resize"]
    assert (resized.width, resized.height) == (24, 16)  # type: ignore[attr-defined]
    record = images.get_record(resized.image.image_name)  # type: ignore[attr-defined]
    assert (record.session_id, record.node_id) == (item.session_id, "resize")
    with Image.open(images.full_path(record.image_name)) as png:
        graph = json.loads(png.text[GRAPH_KEY])
    # The graph is stored as validated: the "#ff0000" the batch sent is read into InvokeAI's ColorField.
    assert graph["nodes"]["blank"]["color"] == {"r": 255, "g": 0, "b": 0, "a": 255}


def test_images_carry_the_batch_workflow_and_the_nodes_intermediate_flag(
    processor: SessionProcessor, queue: SessionQueue, recorder: EventRecorder, images: ImageService
) -> None:
    """InvokeAI's clients send a workflow with the batch and mark the graph's inner nodes is_intermediate: the
    workflow goes into every image the items make, and an intermediate node's image stays out of the gallery."""
    batch = image_batch()
    batch.graph.nodes["blank"].is_intermediate = True
    batch.workflow = {"name": "resize a red square", "nodes": [], "edges": [], "note": "\u00e9\u6f22"}
    [item_id] = queue.enqueue_batch("default", batch).item_ids
    assert recorder.wait_status(item_id, "completed", "failed") == "completed"
    results = queue.get("default", item_id).session.results  # type: ignore[union-attr]
    inner, final = (results[node].image.image_name for node in ("blank", "resize"))  # type: ignore[attr-defined]
    assert images.get_record(inner).is_intermediate and not images.get_record(final).is_intermediate
    assert images.get_record(final).has_workflow
    with Image.open(images.full_path(final)) as png:
        assert json.loads(png.text["invokeai_workflow"]) == batch.workflow
    listed, total = images.list(is_intermediate=False)
    assert total == 1
    assert final in {r.image_name for r in listed} and inner not in {r.image_name for r in listed}
    assert [r.image_name for r in images.list(is_intermediate=True)[0]] == [inner]


def test_every_node_runs_inside_its_attention_caller(
    processor: SessionProcessor, queue: SessionQueue, recorder: EventRecorder, scripted_integer_node: list[str]
) -> None:
    [item_id] = queue.enqueue_batch("default", integer_batch(0)).item_ids
    recorder.wait_status(item_id, "completed")
    assert scripted_integer_node == ["integer"]


def test_a_failing_node_fails_its_item_and_the_worker_goes_on(
    processor: SessionProcessor, queue: SessionQueue, recorder: EventRecorder, scripted_integer_node: list[str]
) -> None:
    failing = graph(
        {"ok": {"type": "integer", "value": 0}, "bad": {"type": "integer", "value": -1}, "after": {"type": "float"}},
        [("bad", "value", "after", "value")],
    )
    [failed_id] = queue.enqueue_batch("default", Batch(graph=failing)).item_ids
    [next_id] = queue.enqueue_batch("default", integer_batch(0)).item_ids
    assert recorder.wait_status(failed_id, "completed", "failed") == "failed"
    assert recorder.wait_status(next_id, "completed", "failed") == "completed"
    item = queue.get("default", failed_id)
    assert item.error_type == "RuntimeError"
    assert item.error_message == "failed on purpose with value -1"
    assert item.error_traceback is not None and "RuntimeError: failed on purpose" in item.error_traceback
    assert set(item.session.results) == {"ok"}  # what ran before the failure is kept
    [error] = [event for event in recorder.of_item(failed_id) if isinstance(event, InvocationErrorEvent)]
    assert (error.node_id, error.node_type, error.error_type) == ("bad", "integer", "RuntimeError")
    assert recorder.names(failed_id)[-2:] == ["invocation_error", "queue_item_status_changed"]


def test_cancel_stops_a_long_node_at_its_next_step(
    processor: SessionProcessor, queue: SessionQueue, recorder: EventRecorder, scripted_integer_node: list[str]
) -> None:
    two_long_nodes = graph(
        {"long": {"type": "integer", "value": 1000}, "next": {"type": "integer", "value": 5}},
    )
    [item_id] = queue.enqueue_batch("default", Batch(graph=two_long_nodes)).item_ids
    recorder.wait_event(item_id, "invocation_progress")
    started = time.monotonic()
    queue.cancel("default", item_id)
    wait_until(lambda: not processor.status().is_processing, what="the worker to drop the item")
    assert time.monotonic() - started < 1.0
    item = queue.get("default", item_id)
    assert (item.status, item.cancel_reason, item.session.results) == ("canceled", CANCEL_REASON, {})
    progress = [e for e in recorder.of_item(item_id) if isinstance(e, InvocationProgressEvent)]
    assert 1 <= len(progress) < 1000
    assert {e.node_id for e in progress} == {"long"}  # the next node never started
    assert "invocation_complete" not in recorder.names(item_id)


def test_progress_events_count_steps_and_carry_a_small_preview(
    processor: SessionProcessor, queue: SessionQueue, recorder: EventRecorder, scripted_integer_node: list[str]
) -> None:
    [item_id] = queue.enqueue_batch("default", integer_batch(3)).item_ids
    recorder.wait_status(item_id, "completed")
    progress = [e for e in recorder.of_item(item_id) if isinstance(e, InvocationProgressEvent)]
    assert [(e.step, e.total) for e in progress] == [(1, 3), (2, 3), (3, 3)]
    assert progress[-1].percentage == 1.0
    preview = progress[0].image
    assert preview is not None and (preview.width, preview.height) == (256, 128)
    assert preview.dataURL.startswith("data:image/jpeg;base64,")
    assert progress[1].image is None


def test_progress_nobody_watches_makes_no_preview_and_no_event(
    queue: SessionQueue, images: ImageService, events: EventBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended: list[EventBase] = []
    events.add_listener(ended.append, frozenset({"queue_item_status_changed"}))
    watched: list[EventBase] = []
    made: list[int] = []

    def invoke(self: IntegerInvocation, context: InvocationContext) -> IntegerOutput:
        for step in range(1, 5):
            if step == 3:  # a client starts watching progress mid-node
                events.add_listener(watched.append, frozenset({"invocation_progress"}))
            context.progress(step, 4, lambda step=step: made.append(step) or Image.new("RGB", (2, 2)))  # type: ignore[func-returns-value]
        return IntegerOutput(value=self.value)

    IntegerInvocation.output_class()
    monkeypatch.setattr(IntegerInvocation, "invoke", invoke)
    worker = SessionProcessor(queue, images, events)
    worker.start()
    try:
        [item_id] = queue.enqueue_batch("default", integer_batch()).item_ids
        wait_until(lambda: ended and ended[-1].status in ("completed", "failed"), what="the item to end")  # type: ignore[attr-defined]
    finally:
        worker.stop()
    assert ended[-1].status == "completed", queue.get("default", item_id).error_message  # type: ignore[attr-defined]
    assert made == [3, 4]
    assert [(e.step, e.image is not None) for e in watched] == [(3, True), (4, True)]  # type: ignore[attr-defined]
    assert {e.item_id for e in watched} == {item_id}  # type: ignore[attr-defined]


def test_a_forwarding_listener_gets_progress_but_makes_no_preview(
    queue: SessionQueue, images: ImageService, events: EventBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The event relay to other servers forwards progress without its image: a preview is made for a reader here.
    forwarded: list[EventBase] = []
    events.add_listener(forwarded.append, forwards=True)
    made: list[int] = []

    def invoke(self: IntegerInvocation, context: InvocationContext) -> IntegerOutput:
        for step in range(1, 3):
            context.progress(step, 2, lambda step=step: made.append(step) or Image.new("RGB", (2, 2)))  # type: ignore[func-returns-value]
        return IntegerOutput(value=self.value)

    IntegerInvocation.output_class()
    monkeypatch.setattr(IntegerInvocation, "invoke", invoke)
    worker = SessionProcessor(queue, images, events)
    worker.start()
    try:
        [item_id] = queue.enqueue_batch("default", integer_batch()).item_ids
        wait_until(lambda: any(getattr(e, "status", None) == "completed" for e in forwarded), what="the item's end")
    finally:
        worker.stop()
    progress = [e for e in forwarded if isinstance(e, InvocationProgressEvent) and e.item_id == item_id]
    assert [(e.step, e.image) for e in progress] == [(1, None), (2, None)]
    assert made == []


def test_pause_holds_items_and_resume_runs_them(
    processor: SessionProcessor, queue: SessionQueue, recorder: EventRecorder
) -> None:
    assert processor.pause().is_started is False
    [item_id] = queue.enqueue_batch("default", integer_batch()).item_ids
    time.sleep(0.2)
    assert queue.get("default", item_id).status == "pending"
    assert processor.resume().is_started is True
    assert recorder.wait_status(item_id, "completed") == "completed"


def test_items_run_by_priority(processor: SessionProcessor, queue: SessionQueue, recorder: EventRecorder) -> None:
    processor.pause()
    later = queue.enqueue_batch("default", integer_batch()).item_ids[0]
    sooner = queue.enqueue_batch("default", integer_batch(), prepend=True).item_ids[0]
    processor.resume()
    recorder.wait_status(later, "completed")
    started = [e.item_id for e in recorder.events if getattr(e, "status", None) == "in_progress"]  # type: ignore[attr-defined]
    assert started == [sooner, later]


def test_stop_cancels_the_running_item_promptly(
    queue: SessionQueue, images: ImageService, events, recorder: EventRecorder, scripted_integer_node: list[str]
) -> None:
    worker = SessionProcessor(queue, images, events)
    worker.start()
    [item_id] = queue.enqueue_batch("default", integer_batch(100_000)).item_ids
    recorder.wait_event(item_id, "invocation_progress")
    started = time.monotonic()
    worker.stop()
    assert time.monotonic() - started < 1.0
    item = queue.get("default", item_id)
    assert (item.status, item.cancel_reason) == ("canceled", SHUTDOWN_REASON)
    assert worker.status().is_started is False
