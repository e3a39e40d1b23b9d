"""Two session workers in one process (generation_devices: [cpu, cpu]): items run at once, each exactly once;
cancel, stop and pause with both busy; the worker recorded on each item; model affinity with its bounded wait."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from engine_support import ENGINES
from queue_support import EventRecorder, graph, integer_batch, wait_until

from invokeai.app.nodes.base import InvocationContext
from invokeai.app.nodes.primitives import IntegerInvocation, IntegerOutput
from invokeai.app.services.events import EventBus, QueueItemStatusChangedEvent
from invokeai.app.services.images import ImageService
from invokeai.app.services.model_manager import ModelManager
from invokeai.app.services.model_records import ModelRecordService
from invokeai.app.services.queue_claims import graph_models
from invokeai.app.services.queue_models import Batch, BatchDatum
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import CANCEL_REASON, SHUTDOWN_REASON, SessionQueue
from invokeai.app.services.sqlite import SqliteDatabase
from invokeai.backend.attention import current_device
from invokeai.backend.cache.model_cache import ModelCache

CPU = torch.device("cpu")
RENDEZVOUS = 7  # an integer node of this value waits until another worker's node of the same value is running


@pytest.fixture
def managers(db: SqliteDatabase) -> list[tuple[str, ModelManager]]:
    shared = ModelManager(ModelRecordService(db), ModelCache(2**20, CPU, 0), CPU, torch.float32)
    return [(name, shared.for_device(CPU, torch.float32)) for name in ("cpu#0", "cpu#1")]


@pytest.fixture
def two_workers(
    queue: SessionQueue, images: ImageService, events: EventBus, managers: list[tuple[str, ModelManager]]
) -> Iterator[SessionProcessor]:
    processor = SessionProcessor(queue, images, events, workers=managers)
    processor.start()
    yield processor
    processor.stop()


@pytest.fixture
def rendezvous_node(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """The integer node, scripted: RENDEZVOUS meets another RENDEZVOUS node at a barrier (so it completes only if
    two run at once); a value above 1000 runs in 10 ms steps until canceled; others return at once. Each run
    records (item id, the worker's attention device)."""
    barrier = threading.Barrier(2, timeout=10)
    seen: dict[str, list] = {"runs": []}

    def invoke(self: IntegerInvocation, context: InvocationContext) -> IntegerOutput:
        seen["runs"].append((context.item_id, current_device()))
        if self.value == RENDEZVOUS:
            barrier.wait()
        for step in range(1, self.value + 1 if self.value > 1000 else 1):
            time.sleep(0.01)
            context.progress(step, self.value, None)
        return IntegerOutput(value=self.value)

    IntegerInvocation.output_class()
    monkeypatch.setattr(IntegerInvocation, "invoke", invoke)
    return seen


def test_two_items_run_at_once_each_on_its_own_worker(
    two_workers: SessionProcessor, queue: SessionQueue, recorder: EventRecorder, rendezvous_node: dict[str, list]
) -> None:
    ids = queue.enqueue_batch("default", integer_batch(RENDEZVOUS, runs=2)).item_ids
    for item_id in ids:
        assert recorder.wait_status(item_id, "completed", "failed") == "completed"  # the barrier let both through
    workers = {queue.get("default", item_id).worker for item_id in ids}
    host_pid = f"{socket.gethostname()}:{os.getpid()}"
    assert workers == {f"{host_pid}/cpu#0", f"{host_pid}/cpu#1"}
    assert {device for _, device in rendezvous_node["runs"]} == {"cpu#0", "cpu#1"}
    # The worker is on the status events from the claim on.
    claimed = [e for e in recorder.events if isinstance(e, QueueItemStatusChangedEvent) and e.status == "in_progress"]
    assert {e.worker for e in claimed} == workers
    assert sum(w.items_completed for w in two_workers.workers()) == 2


def test_sixty_items_each_run_exactly_once(
    two_workers: SessionProcessor, db: SqliteDatabase, events: EventBus, rendezvous_node: dict[str, list]
) -> None:
    queue = SessionQueue(db, events, max_queue_size=100)
    ids = queue.enqueue_batch("default", integer_batch(0, runs=60)).item_ids
    wait_until(lambda: queue.counts_by_status()["completed"] == 60, timeout=30, what="60 items to complete")
    assert Counter(item_id for item_id, _ in rendezvous_node["runs"]) == Counter(ids)
    assert sum(w.items_completed for w in two_workers.workers()) == 60


def test_canceling_one_running_item_leaves_the_other_running(
    two_workers: SessionProcessor, queue: SessionQueue, recorder: EventRecorder, rendezvous_node: dict[str, list]
) -> None:
    first, second = queue.enqueue_batch("default", integer_batch(100_000, runs=2)).item_ids
    recorder.wait_event(first, "invocation_progress")
    recorder.wait_event(second, "invocation_progress")
    status = two_workers.status()
    assert (status.workers, status.running_item_ids) == (2, [first, second])
    assert queue.status("default").item_ids == [first, second]
    queue.cancel("default", first)
    recorder.wait_status(first, "canceled")
    wait_until(lambda: two_workers.status().running_item_ids == [second], what="the first item to leave its worker")
    steps = len([e for e in recorder.of_item(second) if e.event_name == "invocation_progress"])
    wait_until(
        lambda: len([e for e in recorder.of_item(second) if e.event_name == "invocation_progress"]) > steps + 3,
        what="the second item to go on",
    )
    assert queue.get("default", second).status == "in_progress"
    assert queue.get("default", first).cancel_reason == CANCEL_REASON


def test_stop_with_both_workers_busy_cancels_both_promptly(
    queue: SessionQueue,
    images: ImageService,
    events: EventBus,
    recorder: EventRecorder,
    managers: list[tuple[str, ModelManager]],
    rendezvous_node: dict[str, list],
) -> None:
    processor = SessionProcessor(queue, images, events, workers=managers)
    processor.start()
    ids = queue.enqueue_batch("default", integer_batch(100_000, runs=2)).item_ids
    for item_id in ids:
        recorder.wait_event(item_id, "invocation_progress")
    started = time.monotonic()
    processor.stop()
    assert time.monotonic() - started < 1.0
    assert [queue.get("default", i).cancel_reason for i in ids] == [SHUTDOWN_REASON, SHUTDOWN_REASON]
    assert processor.status().is_started is False


def test_pause_holds_both_workers(
    two_workers: SessionProcessor, queue: SessionQueue, recorder: EventRecorder, rendezvous_node: dict[str, list]
) -> None:
    two_workers.pause()
    ids = queue.enqueue_batch("default", integer_batch(RENDEZVOUS, runs=2)).item_ids
    time.sleep(0.2)
    assert [queue.get("default", i).status for i in ids] == ["pending", "pending"]
    two_workers.resume()
    assert [recorder.wait_status(i, "completed", "failed") for i in ids] == ["completed", "completed"]


# Model affinity, at the claim: which pending item a worker with models on its device takes.


def model_batch(name: str) -> Batch:
    """One node that names model `name` (the claim only reads the names; the item never runs here)."""
    return Batch(graph=graph({"enc": {"type": "sd_text_encoder", "model": {"name": name}, "prompt": "p"}}))


def test_enqueue_stores_the_models_each_item_uses_after_its_batch_data(queue: SessionQueue) -> None:
    batch = model_batch("X")
    batch.data = [[BatchDatum(node_path="enc", field_name="model", items=[{"name": "X"}, {"key": "k-y"}])]]
    ids = queue.enqueue_batch("default", batch).item_ids
    stored = [queue._db.execute("SELECT models FROM session_queue WHERE item_id = ?", (i,))[0]["models"] for i in ids]
    assert stored == ['["name:x"]', '["key:k-y"]']
    assert graph_models(integer_batch().graph) == []


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_a_worker_takes_the_item_whose_models_it_holds_over_an_older_one(queue: SessionQueue) -> None:
    [older_y] = queue.enqueue_batch("default", model_batch("Y")).item_ids
    [newer_x] = queue.enqueue_batch("default", model_batch("X")).item_ids
    holder = queue.dequeue("cpu#0", frozenset({"name:x", "key:k-x"}))
    assert holder is not None and holder.item_id == newer_x and holder.worker == f"{queue.server}/cpu#0"
    other = queue.dequeue("cpu#1", frozenset())
    assert other is not None and other.item_id == older_y


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_an_older_item_that_uses_no_models_is_not_passed_over(queue: SessionQueue) -> None:
    # An item without models has all its models on every device: running it first loads nothing.
    [older_plain] = queue.enqueue_batch("default", integer_batch()).item_ids
    [newer_x] = queue.enqueue_batch("default", model_batch("X")).item_ids
    [later_plain] = queue.enqueue_batch("default", integer_batch()).item_ids
    taken = queue.dequeue("cpu#0", frozenset({"name:x"}))
    assert taken is not None and taken.item_id == older_plain
    # Behind an item whose models this device lacks, a later model-less item is as good as one on the device.
    queue.cancel("default", newer_x)
    [older_y] = queue.enqueue_batch("default", model_batch("Y")).item_ids
    queue.cancel("default", later_plain)
    [plain] = queue.enqueue_batch("default", integer_batch()).item_ids
    taken = queue.dequeue("cpu#0", frozenset({"name:x"}))
    assert taken is not None and taken.item_id == plain
    assert queue.get("default", older_y).status == "pending"


def test_an_item_that_waited_past_the_bound_is_taken_whatever_its_models(db: SqliteDatabase, events: EventBus) -> None:
    queue = SessionQueue(db, events, max_queue_size=20, affinity_max_wait_s=0.2)
    [older_y] = queue.enqueue_batch("default", model_batch("Y")).item_ids
    queue.enqueue_batch("default", model_batch("X"))
    time.sleep(0.3)
    taken = queue.dequeue("cpu#0", frozenset({"name:x"}))
    assert taken is not None and taken.item_id == older_y


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_affinity_does_not_pass_over_a_higher_priority_nor_a_pause(queue: SessionQueue) -> None:
    queue.enqueue_batch("default", model_batch("X"))
    [urgent] = queue.enqueue_batch("default", model_batch("Y"), prepend=True).item_ids
    queue.set_paused(True)  # the preferred item is not claimed past the shared pause either
    assert queue.dequeue("cpu#0", frozenset({"name:x"})) is None
    queue.set_paused(False)
    taken = queue.dequeue("cpu#0", frozenset({"name:x"}))
    assert taken is not None and taken.item_id == urgent


def test_a_retried_item_keeps_its_models(queue: SessionQueue) -> None:
    [item_id] = queue.enqueue_batch("default", model_batch("X")).item_ids
    queue.cancel("default", item_id)
    [retry] = queue.retry_items_by_id("default", [item_id]).item_ids
    assert queue._db.execute("SELECT models FROM session_queue WHERE item_id = ?", (retry,))[0]["models"] == (
        '["name:x"]'
    )


def test_workers_report_their_device_item_and_cached_models(
    two_workers: SessionProcessor,
    queue: SessionQueue,
    recorder: EventRecorder,
    managers: list[tuple[str, ModelManager]],
    rendezvous_node: dict[str, list],
) -> None:
    _, manager = managers[0]
    with manager.cache.on_device("k1:unet", lambda: torch.nn.Linear(4, 4), 0, CPU):
        pass
    [item_id] = queue.enqueue_batch("default", integer_batch(100_000)).item_ids
    recorder.wait_event(item_id, "invocation_progress")
    infos = {info.name: info for info in two_workers.workers()}
    busy = [info for info in infos.values() if info.busy]
    assert len(busy) == 1 and (busy[0].item_id, busy[0].queue_id) == (item_id, "default")
    assert [info.device for info in infos.values()] == ["cpu", "cpu"]
    for info in infos.values():  # the RAM cache is shared: both see the model, on the CPU both hold it
        assert [(m.key, m.component, m.on_device, m.size_bytes) for m in info.cached_models] == [
            ("k1", "unet", True, (16 + 4) * 4)
        ]
    queue.cancel("default", item_id)
