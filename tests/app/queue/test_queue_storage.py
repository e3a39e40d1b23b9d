"""What the queue keeps on disk: a batch's graph once, each item only its own batch data; clear and prune give the
space back; a damaged row never breaks a read; retries; the pause survives a restart; migration 4 keeps old items."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import ENGINES
from queue_support import EventRecorder, graph, integer_batch

from invokeai.app.services.events import EventBus, QueueItemsRetriedEvent
from invokeai.app.services.images import ImageService
from invokeai.app.services.migrations import MIGRATIONS
from invokeai.app.services.queue_models import Batch, BatchDatum
from invokeai.app.services.session_processor import UNREADABLE_ERROR_TYPE, SessionProcessor
from invokeai.app.services.session_queue import QueueItemNotFoundError, RetryRefusedError, SessionQueue
from invokeai.app.services.sqlite import SqliteDatabase

MB = 1_000_000


def db_bytes(path: Path) -> int:
    """The database file with its WAL and shared-memory file, as a user sees them on disk."""
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "db" / "invokeai.db"


@pytest.fixture
def file_db(db_path: Path) -> Iterator[SqliteDatabase]:
    database = SqliteDatabase(db_path)
    yield database
    database.close()


def big_graph_batch(runs: int) -> Batch:
    """A 200 KB graph: 40 string nodes of 5,000 characters each."""
    nodes = {f"s{i}": {"type": "string", "value": f"{i:04d}" * 1250} for i in range(40)}
    return Batch(graph=graph(nodes), runs=runs)


def test_a_200_kb_graph_with_500_runs_grows_the_database_by_less_than_5_mb(
    file_db: SqliteDatabase, db_path: Path
) -> None:
    queue = SessionQueue(file_db, EventBus(), max_queue_size=1000)
    batch = big_graph_batch(runs=500)
    assert len(batch.graph.model_dump_json()) > 200_000
    before = db_bytes(db_path)
    result = queue.enqueue_batch("default", batch)
    grown = db_bytes(db_path) - before
    assert result.enqueued == 500
    assert grown < 5 * MB, f"grew {grown / MB:.1f} MB"
    # Each item still reads back with the whole graph.
    items, total = queue.list_items("default", None, 0, 500)
    assert total == 500 and all(item.session and len(item.session.graph.nodes) == 40 for item in items)


def test_items_store_only_their_own_batch_data_and_read_back_with_it(file_db: SqliteDatabase) -> None:
    queue = SessionQueue(file_db, EventBus(), max_queue_size=100)
    data = [[BatchDatum(node_path="n", field_name="value", items=[7, 8, 9])]]
    result = queue.enqueue_batch("default", integer_batch(value=1, runs=2, data=data))
    assert file_db.execute("SELECT COUNT(*) AS n FROM session_queue_graphs")[0]["n"] == 1
    items = [queue.get("default", item_id) for item_id in result.item_ids]
    assert [item.session.graph.nodes["n"].value for item in items if item.session] == [7, 8, 9, 7, 8, 9]
    listed, _ = queue.list_items("default", None, 0, 10)
    assert [item.model_dump() for item in listed] == [item.model_dump() for item in items]


@pytest.mark.parametrize("how", ["clear", "prune"])
def test_clear_and_prune_give_the_space_back(file_db: SqliteDatabase, db_path: Path, how: str) -> None:
    queue = SessionQueue(file_db, EventBus(), max_queue_size=1000)
    queue.enqueue_batch("default", integer_batch())  # stays (pending) through a prune
    baseline = db_bytes(db_path)
    # 200 items of 50 KB of batch data each: 10 MB that belongs to the items alone, and graphs of several batches.
    for number in range(4):
        values = [f"{number}{k:04d}" * 10_000 for k in range(50)]
        data = [[BatchDatum(node_path="s", field_name="value", items=values)]]
        queue.enqueue_batch("default", Batch(graph=graph({"s": {"type": "string", "value": ""}}), data=data))
    assert db_bytes(db_path) > baseline + 10 * MB
    if how == "clear":
        queue.clear("default")
    else:
        queue.cancel_by_batch_ids(
            "default",
            [
                row["batch_id"]
                for row in file_db.execute("SELECT DISTINCT batch_id FROM session_queue WHERE field_values IS NOT NULL")
            ],
        )
        assert queue.prune("default") == 200
        assert queue.counts_by_status("default")["pending"] == 1
    assert db_bytes(db_path) < baseline + 1 * MB, f"{db_bytes(db_path) / MB:.1f} MB after {how}"


def _corrupt(db: SqliteDatabase, item_id: int, column: str, value: object) -> None:
    db.execute(f"UPDATE session_queue SET {column} = ? WHERE item_id = ?", (value, item_id))


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("field_values", "not json"),
        ("field_values", b"[]"),
        ("field_values", '[{"node_path": "n", "field_name": "value", "value": null}]'),
        ("field_values", '[{"node_path": "gone", "field_name": "value", "value": 1}]'),
        ("results", '{"n": {"type": "integer_output", "value": "\\ud800"}}'),
        ("created_at", "yesterday"),
    ],
)
def test_a_damaged_row_reads_back_with_its_reason_and_the_others_are_intact(
    db: SqliteDatabase, events: EventBus, column: str, value: object
) -> None:
    queue = SessionQueue(db, events, max_queue_size=20)
    data = [[BatchDatum(node_path="n", field_name="value", items=[1, 2, 3])]]
    ids = queue.enqueue_batch("default", integer_batch(data=data)).item_ids
    _corrupt(db, ids[1], column, value)
    items, total = queue.list_items("default", None, 0, 10)
    assert total == 3
    broken = items[1]
    assert broken.item_id == ids[1] and broken.session is None and broken.read_error
    assert "cannot be read" in broken.read_error
    broken.model_dump_json()  # encodable: a lone surrogate never reaches a response
    assert [item.read_error for item in (items[0], items[2])] == [None, None]
    assert queue.get("default", ids[1]).read_error == broken.read_error
    assert queue.cancel("default", ids[1]).status == "canceled"


def test_text_that_is_not_utf_8_reads_back_instead_of_failing_every_query(db: SqliteDatabase, events: EventBus) -> None:
    queue = SessionQueue(db, events, max_queue_size=20)
    ids = queue.enqueue_batch("default", integer_batch(runs=2)).item_ids
    db.execute("UPDATE session_queue SET error_message = CAST(X'FF41' AS TEXT) WHERE item_id = ?", (ids[1],))
    items, _ = queue.list_items("default", None, 0, 10)
    assert items[1].error_message == "\ufffdA" and items[1].read_error is None


def test_a_graph_that_no_longer_validates_is_a_read_error(db: SqliteDatabase, events: EventBus) -> None:
    queue = SessionQueue(db, events, max_queue_size=20)
    [item_id] = queue.enqueue_batch("default", integer_batch()).item_ids
    # What the server stored for NaN before issue 16: null in a number field.
    db.execute("UPDATE session_queue_graphs SET graph = replace(graph, '\"value\":0', '\"value\":null')")
    item = queue.get("default", item_id)
    assert item.session is None and item.read_error and "value" in item.read_error


def test_the_processor_fails_an_unreadable_item_and_takes_the_next(
    queue: SessionQueue, db: SqliteDatabase, images: ImageService, events: EventBus, recorder: EventRecorder
) -> None:
    broken, good = (queue.enqueue_batch("default", integer_batch(value=v)).item_ids[0] for v in (1, 2))
    _corrupt(db, broken, "field_values", "{")
    worker = SessionProcessor(queue, images, events)
    worker.start()
    try:
        assert recorder.wait_status(good, "completed", "failed") == "completed"
    finally:
        worker.stop()
    item = queue.get("default", broken)
    assert item.status == "failed" and item.error_type == UNREADABLE_ERROR_TYPE
    assert item.error_message and "cannot be read" in item.error_message


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_retry_enqueues_failed_and_canceled_items_again_linked_to_the_original(
    queue: SessionQueue, recorder: EventRecorder
) -> None:
    data = [[BatchDatum(node_path="n", field_name="value", items=[5, 6])]]
    first, second = queue.enqueue_batch("default", integer_batch(data=data), prepend=True).item_ids
    queue.cancel("default", first)
    taken = queue.dequeue()
    assert taken is not None and taken.item_id == second
    queue.fail(second, "ValueError", "boom", "", {})
    result = queue.retry_items_by_id("default", [second, first, second])
    assert result.retried_item_ids == [second, first]
    assert len(result.item_ids) == 2 and not set(result.item_ids) & {first, second}
    for original, new in zip(result.retried_item_ids, result.item_ids, strict=True):
        old, retried = queue.get("default", original), queue.get("default", new)
        assert retried.status == "pending" and retried.retried_from_item_id == original
        kept = ("batch_id", "priority", "field_values")
        assert [getattr(retried, name) for name in kept] == [getattr(old, name) for name in kept]
        assert retried.session and old.session and retried.session.graph == old.session.graph
        assert retried.session_id != old.session_id and old.status in ("failed", "canceled")
    assert any(isinstance(e, QueueItemsRetriedEvent) and e.item_ids == result.item_ids for e in recorder.events)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_retry_refuses_unknown_and_unfinished_items_and_enqueues_nothing(queue: SessionQueue) -> None:
    pending, canceled = queue.enqueue_batch("default", integer_batch(runs=2)).item_ids
    queue.cancel("default", canceled)
    with pytest.raises(RetryRefusedError, match=f"{pending} \\(pending\\)"):
        queue.retry_items_by_id("default", [canceled, pending])
    with pytest.raises(QueueItemNotFoundError, match="999"):
        queue.retry_items_by_id("default", [canceled, 999])
    with pytest.raises(QueueItemNotFoundError):
        queue.retry_items_by_id("another", [canceled])
    assert queue.counts_by_status("default") == {**queue.counts_by_status("default"), "pending": 1}
    assert queue.list_items("default", None, 0, 10)[1] == 2


def test_a_pause_lasts_across_a_restart(db_path: Path, tmp_path: Path) -> None:
    def open_processor() -> tuple[SqliteDatabase, SessionProcessor]:
        database = SqliteDatabase(db_path)
        events = EventBus()
        queue = SessionQueue(database, events, max_queue_size=20)
        return database, SessionProcessor(queue, ImageService(database, tmp_path / "out", 1_000_000), events)

    database, processor = open_processor()
    processor.start()
    processor.pause()
    processor.stop()
    database.close()
    database, processor = open_processor()
    processor.start()
    try:
        assert processor.status().is_started is False
        processor.resume()
    finally:
        processor.stop()
        database.close()
    database, processor = open_processor()
    processor.start()
    try:
        assert processor.status().is_started is True
    finally:
        processor.stop()
        database.close()


def test_migration_4_keeps_old_items_their_graphs_and_the_id_counter(db_path: Path) -> None:
    old = SqliteDatabase(db_path, MIGRATIONS[:3])
    graph_text = json.dumps({"id": "g", "nodes": {"n": {"id": "n", "type": "integer", "value": 4}}, "edges": []})
    for number in range(1, 4):
        old.execute(
            "INSERT INTO session_queue (queue_id, batch_id, session_id, status, graph, field_values, results, "
            "created_at, updated_at) VALUES ('default', 'b', ?, ?, ?, ?, ?, '2026-01-01T00:00:00+00:00', "
            "'2026-01-01T00:00:00+00:00')",
            (
                f"s{number}",
                "completed" if number < 3 else "pending",
                graph_text,
                '[{"node_path": "n", "field_name": "value", "value": 4}]' if number == 2 else None,
                '{"n": {"type": "integer_output", "value": 4}}' if number < 3 else None,
            ),
        )
    old.execute("DELETE FROM session_queue WHERE item_id = 3")  # the counter stays at 3
    old.close()
    new = SqliteDatabase(db_path)
    try:
        assert new.schema_version == len(MIGRATIONS)
        queue = SessionQueue(new, EventBus(), max_queue_size=20)
        items, total = queue.list_items("default", None, 0, 10)
        assert total == 2 and [item.read_error for item in items] == [None, None]
        assert [item.session.graph.nodes["n"].value for item in items if item.session] == [4, 4]
        assert items[0].session and items[0].session.results["n"].value == 4  # type: ignore[union-attr]
        assert new.execute("SELECT COUNT(*) AS n FROM session_queue_graphs")[0]["n"] == 1
        assert queue.enqueue_batch("default", integer_batch()).item_ids == [4]
    finally:
        new.close()


def test_a_waiting_processor_takes_a_retried_item_at_once(
    queue: SessionQueue, images: ImageService, events: EventBus, recorder: EventRecorder
) -> None:
    canceled, done = queue.enqueue_batch("default", integer_batch(runs=2)).item_ids
    queue.cancel("default", canceled)
    worker = SessionProcessor(queue, images, events)
    worker.start()
    try:
        recorder.wait_status(done, "completed")
        [retried] = queue.retry_items_by_id("default", [canceled]).item_ids  # the worker is waiting for a wake-up
        assert recorder.wait_status(retried, "completed", "failed") == "completed"
    finally:
        worker.stop()
