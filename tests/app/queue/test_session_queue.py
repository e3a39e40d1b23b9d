"""The session queue store: enqueue all-or-nothing, order, status changes and their events, restart recovery."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from engine_support import ENGINES
from queue_support import EventRecorder, integer_batch

from invokeai.app.services.batch import InvalidBatchError
from invokeai.app.services.database import Database
from invokeai.app.services.events import BatchEnqueuedEvent, EventBus, QueueItemStatusChangedEvent
from invokeai.app.services.queue_models import BatchDatum
from invokeai.app.services.session_queue import (
    RESTART_REASON,
    QueueFullError,
    QueueItemNotFoundError,
    SessionQueue,
)
from invokeai.app.services.sqlite import SqliteDatabase


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_enqueue_makes_one_pending_item_per_run_and_combination(queue: SessionQueue, recorder: EventRecorder) -> None:
    batch = integer_batch(runs=2, data=[[BatchDatum(node_path="n", field_name="value", items=[1, 2, 3])]])
    result = queue.enqueue_batch("default", batch)
    assert (result.enqueued, result.requested, len(result.item_ids)) == (6, 6, 6)
    items = [queue.get("default", item_id) for item_id in result.item_ids]
    assert {item.status for item in items} == {"pending"}
    assert {item.batch_id for item in items} == {batch.batch_id}
    assert len({item.session_id for item in items}) == 6
    assert [item.session.graph.nodes["n"].value for item in items] == [1, 2, 3, 1, 2, 3]
    assert [item.field_values[0].value for item in items if item.field_values] == [1, 2, 3, 1, 2, 3]
    [event] = recorder.events
    assert isinstance(event, BatchEnqueuedEvent)
    assert (event.batch_id, event.enqueued, event.queue_id) == (batch.batch_id, 6, "default")


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_next_item_is_highest_priority_then_oldest(queue: SessionQueue) -> None:
    first = queue.enqueue_batch("default", integer_batch(runs=2)).item_ids
    urgent = queue.enqueue_batch("default", integer_batch(), prepend=True)
    more_urgent = queue.enqueue_batch("default", integer_batch(), prepend=True)
    assert (urgent.priority, more_urgent.priority) == (1, 2)
    order = [queue.dequeue() for _ in range(4)]
    assert [item.item_id for item in order if item] == [*more_urgent.item_ids, *urgent.item_ids, *first]
    assert queue.dequeue() is None


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_dequeue_hands_each_item_to_one_caller(queue: SessionQueue) -> None:
    queue.enqueue_batch("default", integer_batch(runs=20))
    taken: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        while (item := queue.dequeue()) is not None:
            with lock:
                taken.append(item.item_id)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == list(range(1, 21))


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_a_batch_that_would_overflow_the_queue_is_refused_whole(queue: SessionQueue, recorder: EventRecorder) -> None:
    queue.enqueue_batch("default", integer_batch(runs=15))
    with pytest.raises(QueueFullError, match="the batch makes 6 queue items and 15 are pending; at most 20"):
        queue.enqueue_batch("other", integer_batch(runs=6))
    assert queue.counts_by_status()["pending"] == 15
    queue.enqueue_batch("other", integer_batch(runs=5))  # exactly full is fine
    assert queue.counts_by_status()["pending"] == 20
    assert len(recorder.events) == 2


class _CountsThenWaits(SessionQueue):
    """A server whose enqueue, once it has counted the pending items, waits (at most 0.5 s) for the other enqueuer to
    have counted too: the interleaving under which unlocked counts both saw room for their batch."""

    barrier: threading.Barrier

    def _pending_count(self, cursor):  # type: ignore[no-untyped-def]
        counted = super()._pending_count(cursor)
        try:
            self.barrier.wait(timeout=0.5)
        except threading.BrokenBarrierError:
            pass  # the other enqueuer is waiting for this one's transaction: the count is exact
        return counted


@pytest.mark.parametrize("action", ["enqueue", "retry"])
@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_max_queue_size_is_exact_under_concurrent_enqueues(db: Database, action: str) -> None:
    # Two servers (two queues on the database) enqueue 30 items each at once against a limit of 40: one fits, the
    # other is refused whole, whatever the interleaving.
    _CountsThenWaits.barrier = threading.Barrier(1)  # no waiting while the test sets up
    servers = [_CountsThenWaits(db, EventBus(), max_queue_size=40, server=f"s:{n}") for n in range(2)]
    retried: list[list[int]] = []
    if action == "retry":
        for _ in servers:
            ids = servers[0].enqueue_batch("default", integer_batch(runs=30)).item_ids
            servers[0].cancel_by_batch_ids("default", [servers[0].get("default", ids[0]).batch_id])
            retried.append(ids)
    _CountsThenWaits.barrier = threading.Barrier(2)
    outcomes: list[object] = []

    def add(index: int) -> None:
        server = servers[index]
        try:
            if action == "retry":
                outcomes.append(server.retry_items_by_id("default", retried[index]))
            else:
                outcomes.append(server.enqueue_batch("default", integer_batch(runs=30)))
        except QueueFullError as error:
            outcomes.append(error)

    threads = [threading.Thread(target=add, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    refused = [outcome for outcome in outcomes if isinstance(outcome, QueueFullError)]
    assert (len(outcomes), len(refused)) == (2, 1), outcomes
    assert servers[0].counts_by_status()["pending"] == 30


def test_finished_items_do_not_count_against_the_limit(queue: SessionQueue) -> None:
    queue.enqueue_batch("default", integer_batch(runs=20))
    queue.cancel_by_batch_ids("default", [queue.get("default", 1).batch_id])
    queue.enqueue_batch("default", integer_batch(runs=20))


def test_an_invalid_graph_enqueues_nothing(queue: SessionQueue, recorder: EventRecorder) -> None:
    data = [[BatchDatum(node_path="n", field_name="value", items=[1, 2, "three"])]]
    with pytest.raises(InvalidBatchError):
        queue.enqueue_batch("default", integer_batch(data=data))
    assert queue.counts_by_status() == dict.fromkeys(["pending", "in_progress", "completed", "failed", "canceled"], 0)
    assert recorder.events == []


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_status_changes_carry_timestamps_and_publish_events(queue: SessionQueue, recorder: EventRecorder) -> None:
    [item_id] = queue.enqueue_batch("default", integer_batch()).item_ids
    running = queue.dequeue()
    assert running is not None and running.status == "in_progress" and running.started_at is not None
    assert queue.complete(item_id, {"n": {"type": "integer_output", "value": 0}})
    done = queue.get("default", item_id)
    assert done.status == "completed"
    assert done.created_at <= done.started_at <= done.completed_at  # type: ignore[operator]
    assert done.session.results["n"].value == 0  # type: ignore[attr-defined]
    changes = [e for e in recorder.events if isinstance(e, QueueItemStatusChangedEvent)]
    assert [(e.item_id, e.status) for e in changes] == [(item_id, "in_progress"), (item_id, "completed")]


def test_fail_records_the_error(queue: SessionQueue) -> None:
    [item_id] = queue.enqueue_batch("default", integer_batch()).item_ids
    queue.dequeue()
    queue.fail(item_id, "RuntimeError", "boom", "Traceback ...", {})
    item = queue.get("default", item_id)
    assert (item.status, item.error_type, item.error_message, item.error_traceback) == (
        "failed",
        "RuntimeError",
        "boom",
        "Traceback ...",
    )


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_cancel_is_final_and_leaves_finished_items_alone(queue: SessionQueue, recorder: EventRecorder) -> None:
    first, second = queue.enqueue_batch("default", integer_batch(runs=2)).item_ids
    running = queue.dequeue()
    assert running is not None and running.item_id == first
    assert queue.cancel("default", first).status == "canceled"
    assert not queue.is_running(first)
    # The worker finishing afterwards does not overwrite the cancel.
    assert not queue.complete(first, {})
    assert queue.get("default", first).status == "canceled"
    assert queue.get("default", first).cancel_reason == "canceled by request"
    assert queue.cancel("default", second).status == "canceled"
    assert queue.cancel("default", second).completed_at == queue.get("default", second).completed_at
    statuses = [(e.item_id, e.status) for e in recorder.events if isinstance(e, QueueItemStatusChangedEvent)]
    assert statuses == [(first, "in_progress"), (first, "canceled"), (second, "canceled")]


def test_items_of_another_queue_are_not_found(queue: SessionQueue) -> None:
    [item_id] = queue.enqueue_batch("mine", integer_batch()).item_ids
    with pytest.raises(QueueItemNotFoundError):
        queue.get("yours", item_id)
    with pytest.raises(QueueItemNotFoundError):
        queue.cancel("yours", item_id)
    assert queue.get("mine", item_id).status == "pending"


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_cancel_by_batch_ids_clear_and_prune(queue: SessionQueue) -> None:
    keep = queue.enqueue_batch("default", integer_batch(runs=2))
    drop = queue.enqueue_batch("default", integer_batch(runs=3))
    other = queue.enqueue_batch("other", integer_batch(runs=1))
    assert queue.cancel_by_batch_ids("default", [drop.batch.batch_id, "no-such-batch"]) == 3
    assert queue.cancel_by_batch_ids("default", [other.batch.batch_id]) == 0  # another queue's batch
    assert queue.counts_by_status("default") == {
        "pending": 2,
        "in_progress": 0,
        "completed": 0,
        "failed": 0,
        "canceled": 3,
    }
    assert queue.prune("default") == 3
    assert queue.status("default").total == 2
    queue.dequeue()
    assert queue.clear("default") == 2
    assert queue.status("default").total == 0
    assert not queue.is_running(keep.item_ids[0])
    assert queue.status("other").pending == 1


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_list_pages_and_filters_by_status(queue: SessionQueue) -> None:
    ids = queue.enqueue_batch("default", integer_batch(runs=5)).item_ids
    queue.cancel("default", ids[1])
    items, total = queue.list_items("default", None, offset=1, limit=2)
    assert total == 5 and [item.item_id for item in items] == ids[1:3]
    items, total = queue.list_items("default", "canceled", offset=0, limit=50)
    assert total == 1 and [item.item_id for item in items] == [ids[1]]
    assert queue.list_items("default", None, offset=10, limit=2) == ([], 5)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_status_names_the_running_item(queue: SessionQueue) -> None:
    queue.enqueue_batch("default", integer_batch(runs=3))
    running = queue.dequeue()
    assert running is not None
    status = queue.status("default")
    assert (status.item_id, status.session_id, status.batch_id) == (
        running.item_id,
        running.session_id,
        running.batch_id,
    )
    assert (status.pending, status.in_progress, status.total) == (2, 1, 3)
    assert queue.status("other").item_id is None


def test_restart_cancels_items_left_in_progress_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    db = SqliteDatabase(path)
    before = SessionQueue(db, EventBus(), 100)
    done, interrupted, waiting = before.enqueue_batch("default", integer_batch(runs=3)).item_ids
    before.dequeue()
    before.complete(done, {"n": {"type": "integer_output", "value": 0}})
    before.dequeue()
    db.close()  # the server died with `interrupted` running

    db = SqliteDatabase(path)
    after = SessionQueue(db, EventBus(), 100)
    assert after.recover_interrupted() == 1
    item = after.get("default", interrupted)
    assert (item.status, item.cancel_reason) == ("canceled", RESTART_REASON)
    assert after.get("default", done).status == "completed"
    assert after.get("default", done).session.results["n"].value == 0  # type: ignore[attr-defined]
    assert after.get("default", waiting).status == "pending"
    assert after.recover_interrupted() == 0
    db.close()
