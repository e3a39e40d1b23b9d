"""Claims, leases and recovery: many threads and several processes (servers) on one queue, each item claimed once;
an expired lease canceled or requeued; a live server's items left alone; the pause shared by every server."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from claim_support import claim_until_empty
from engine_support import ENGINES
from queue_support import EventRecorder, graph, integer_batch, wait_until

from invokeai.app.services.database import Database
from invokeai.app.services.events import EventBus, QueueItemStatusChangedEvent
from invokeai.app.services.images import ImageService
from invokeai.app.services.postgres import PostgresDatabase
from invokeai.app.services.queue_leases import LeaseKeeper
from invokeai.app.services.queue_models import Batch
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import (
    DATABASE_UNREACHABLE_REASON,
    LEASE_EXPIRED_REASON,
    RESTART_REASON,
    SessionQueue,
)
from invokeai.app.services.sqlite import SqliteDatabase

MakeServer = Callable[..., SessionQueue]


@pytest.fixture
def make_server(postgres_url: str) -> Iterator[MakeServer]:
    """make_server(name, **queue options): a server's queue, on its own pool, on the test's PostgreSQL database."""
    opened: list[PostgresDatabase] = []

    def make(name: str, **options: object) -> SessionQueue:
        db = PostgresDatabase(postgres_url, pool_size=4)
        opened.append(db)
        return SessionQueue(db, EventBus(), 10_000, server=name, **options)  # type: ignore[arg-type]

    yield make
    for db in opened:
        db.close()


def _status(queue: SessionQueue, item_id: int) -> str:
    return queue.get("default", item_id).status


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_threads_claim_each_item_exactly_once(db: Database) -> None:
    queue = SessionQueue(db, EventBus(), 10_000)
    ids = queue.enqueue_batch("default", integer_batch(runs=120)).item_ids
    claimed: list[list[int]] = [[] for _ in range(6)]

    def claim(mine: list[int]) -> None:
        while (item := queue.dequeue(worker=f"w{len(mine)}")) is not None:
            mine.append(item.item_id)

    threads = [threading.Thread(target=claim, args=(mine,)) for mine in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [item_id for mine in claimed for item_id in mine]
    assert sorted(every) == sorted(ids)  # each once: no duplicate, none left
    assert queue.counts_by_status("default")["in_progress"] == len(ids)


def test_three_server_processes_claim_each_item_exactly_once(make_server: MakeServer, postgres_url: str) -> None:
    queue = make_server("parent")
    ids = queue.enqueue_batch("default", integer_batch(runs=150)).item_ids
    start_at = time.time() + 4.0  # every process started, imported and connected
    with multiprocessing.get_context("spawn").Pool(3) as processes:
        claims = processes.starmap(claim_until_empty, [(postgres_url, f"host{n}:1", start_at) for n in range(3)])
    every = [item_id for claimed in claims for item_id in claimed]
    assert sorted(every) == sorted(ids)
    assert queue.counts_by_status("default")["completed"] == len(ids)
    with psycopg.connect(postgres_url) as conn:
        workers = dict(conn.execute("SELECT item_id, worker FROM session_queue").fetchall())
    for n, claimed in enumerate(claims):
        assert {workers[item_id] for item_id in claimed} <= {f"host{n}:1/session-processor"}


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_an_expired_lease_is_canceled_with_the_reason_and_finished_items_are_untouched(db: Database) -> None:
    events = EventBus()
    recorder = EventRecorder()
    events.add_listener(recorder)
    queue = SessionQueue(db, events, 100, lease_seconds=0.3)
    done, interrupted, waiting = queue.enqueue_batch("default", integer_batch(runs=3)).item_ids
    queue.dequeue()
    queue.complete(done, {})
    claimed = queue.dequeue()
    assert claimed is not None and claimed.item_id == interrupted
    assert queue.recover_expired() == 0  # not yet expired
    time.sleep(0.4)
    assert queue.recover_expired() == 1
    item = queue.get("default", interrupted)
    assert (item.status, item.cancel_reason) == ("canceled", LEASE_EXPIRED_REASON)
    assert "stopped" in LEASE_EXPIRED_REASON
    assert [_status(queue, done), _status(queue, waiting)] == ["completed", "pending"]
    changed = [e for e in recorder.events if isinstance(e, QueueItemStatusChangedEvent) and e.item_id == interrupted]
    assert changed[-1].status == "canceled"
    assert queue.recover_expired() == 0


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_with_requeue_interrupted_an_expired_item_runs_again(db: Database) -> None:
    queue = SessionQueue(db, EventBus(), 100, lease_seconds=0.3, requeue_interrupted=True)
    (item_id,) = queue.enqueue_batch("default", integer_batch()).item_ids
    queue.dequeue(worker="first")
    time.sleep(0.4)
    assert queue.recover_expired() == 1
    item = queue.get("default", item_id)
    assert (item.status, item.started_at, item.cancel_reason) == ("pending", None, None)
    row = db.execute("SELECT worker, lease_expires_at FROM session_queue WHERE item_id = ?", (item_id,))[0]
    assert (row["worker"], row["lease_expires_at"]) == (None, None)
    again = queue.dequeue(worker="second")
    assert again is not None and again.item_id == item_id


def test_a_starting_server_leaves_a_live_servers_items_alone(make_server: MakeServer) -> None:
    alive, starting = make_server("alive:1", lease_seconds=0.9), make_server("starting:2", lease_seconds=0.9)
    running, later = alive.enqueue_batch("default", integer_batch(runs=2)).item_ids
    alive.dequeue()
    keeper = LeaseKeeper(alive, period=0.2)
    keeper.start()
    try:
        assert starting.recover_interrupted() == 0
        time.sleep(1.3)  # past the first lease: only renewals keep it
        assert starting.recover_expired() == 0
        assert [_status(starting, running), _status(starting, later)] == ["in_progress", "pending"]
    finally:
        keeper.stop()
    # The live server stops renewing (as if killed): the next sweep of the other server recovers the item.
    wait_until(lambda: starting.recover_expired() == 1, timeout=3)
    item = starting.get("default", running)
    assert (item.status, item.cancel_reason) == ("canceled", LEASE_EXPIRED_REASON)


def test_a_server_whose_item_was_recovered_and_claimed_elsewhere_neither_finishes_nor_continues_it(
    make_server: MakeServer,
) -> None:
    cut_off = make_server("cut-off:1", lease_seconds=0.3, requeue_interrupted=True)
    other = make_server("other:2", lease_seconds=30, requeue_interrupted=True)
    (item_id,) = cut_off.enqueue_batch("default", integer_batch()).item_ids
    cut_off.dequeue()
    time.sleep(0.4)  # no renewal reached the database
    assert other.recover_expired() == 1
    assert other.dequeue() is not None
    assert not cut_off.is_running(item_id)  # its next check stops its run
    assert not cut_off.complete(item_id, {})
    assert other.is_running(item_id) and other.complete(item_id, {})
    assert _status(other, item_id) == "completed"


def test_a_server_renews_only_its_own_items(make_server: MakeServer) -> None:
    first, second = make_server("a:1"), make_server("a:12")  # one name is a prefix of the other's
    first.enqueue_batch("default", integer_batch(runs=3))
    mine, theirs = first.dequeue(), second.dequeue()
    assert mine is not None and theirs is not None
    assert first.renew_leases() == 1
    assert first.renew_leases([theirs.item_id]) == 0
    assert first.renew_leases([mine.item_id]) == 1
    assert second.renew_leases() == 1


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_only_the_items_a_worker_runs_now_are_renewed_and_a_dropped_one_is_recovered(db: Database) -> None:
    # A worker that lets an item go without recording its end (a database error at completion) must not leave it
    # in_progress for ever: its lease is no longer renewed, so the sweep recovers it.
    queue = SessionQueue(db, EventBus(), 100, lease_seconds=0.5)
    queue.enqueue_batch("default", integer_batch(runs=2))
    running, dropped = queue.dequeue(worker="w0"), queue.dequeue(worker="w1")
    assert running is not None and dropped is not None
    assert set(queue.running_here()) == {running.item_id, dropped.item_id}
    queue.release(dropped.item_id)
    assert set(queue.running_here()) == {running.item_id}
    deadline = time.monotonic() + 0.7
    while time.monotonic() < deadline:  # past the lease: only renewals keep an item
        assert queue.renew_leases() == 1
        time.sleep(0.1)
    assert queue.recover_expired() == 1
    assert [_status(queue, running.item_id), _status(queue, dropped.item_id)] == ["in_progress", "canceled"]
    assert queue.get("default", dropped.item_id).cancel_reason == LEASE_EXPIRED_REASON
    assert queue.complete(running.item_id, {})
    assert queue.running_here() == {}


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_a_claim_whose_item_cannot_be_read_back_is_not_kept_and_ends_with_the_reason(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The database goes away between the claim's commit and the read of its graph (a restart at that moment): the
    # worker never gets the item. Were the claim kept, its lease would be renewed for ever with no worker on it.
    queue = SessionQueue(db, EventBus(), 100, lease_seconds=30.0)
    queue.enqueue_batch("default", integer_batch(runs=1))
    lost = sqlite3.OperationalError if db.dialect == "sqlite" else psycopg.OperationalError

    def read_back_fails(rows: Any) -> Any:
        raise lost("terminating connection due to administrator command")

    with monkeypatch.context() as patch:
        patch.setattr(queue, "_items", read_back_fails)
        with pytest.raises(lost):
            queue.dequeue(worker="w0")
    assert queue.running_here() == {}
    assert queue.renew_leases() == 0
    assert queue.end_dropped() == 1
    [item] = queue.list_all("default")
    assert (item.status, item.cancel_reason) == ("canceled", DATABASE_UNREACHABLE_REASON)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_a_change_whose_events_cannot_be_made_is_not_recorded_and_its_retry_announces_it_once(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The database goes away while an item's end is announced (its counts read). Had the end committed before, its
    # event would be lost for good: the change and the making of its events are one transaction.
    events = EventBus()
    recorder = EventRecorder()
    events.add_listener(recorder)
    queue = SessionQueue(db, events, 100, lease_seconds=30.0)
    queue.enqueue_batch("default", integer_batch(runs=1))
    item = queue.dequeue(worker="w0")
    assert item is not None
    lost = sqlite3.OperationalError if db.dialect == "sqlite" else psycopg.OperationalError

    def counts_lost(*args: Any) -> Any:
        raise lost("terminating connection due to administrator command")

    with monkeypatch.context() as patch:
        patch.setattr(queue, "_counts_after_change", counts_lost)
        with pytest.raises(lost):
            queue.complete(item.item_id, {})
    assert _status(queue, item.item_id) == "in_progress"
    assert queue.complete(item.item_id, {})
    ends = [e for e in recorder.events if getattr(e, "status", None) == "completed"]
    assert [e.item_id for e in ends] == [item.item_id]


def _skew_this_hosts_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The queue's host clock `seconds` off (a host without NTP); the database's clock is untouched."""
    from invokeai.app.services import session_queue

    def skewed_in(after: float) -> str:
        return (datetime.now(UTC) + timedelta(seconds=seconds + after)).isoformat(timespec="microseconds")

    monkeypatch.setattr(session_queue, "now_iso", lambda: skewed_in(0))
    monkeypatch.setattr(session_queue, "iso_in", skewed_in, raising=False)  # what leases were written with before


@pytest.mark.parametrize("who", ["the claiming host", "the sweeping host"])
@pytest.mark.parametrize("skew_s", [-3600, 3600], ids=["an hour behind", "an hour ahead"])
def test_leases_are_kept_in_the_databases_clock_whatever_the_hosts_clocks(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch, who: str, skew_s: float
) -> None:
    running, sweeping = make_server("r:1", lease_seconds=30), make_server("s:2", lease_seconds=30)
    (item_id,) = running.enqueue_batch("default", integer_batch()).item_ids
    with monkeypatch.context() as patch:
        if who == "the claiming host":
            _skew_this_hosts_clock(patch, skew_s)
        assert running.dequeue() is not None
        assert running.renew_leases() == 1
    with monkeypatch.context() as patch:
        if who == "the sweeping host":
            _skew_this_hosts_clock(patch, skew_s)
        assert sweeping.recover_expired() == 0
    assert _status(sweeping, item_id) == "in_progress"
    lease = sweeping._db.execute(
        "SELECT lease_expires_at > to_char(now() AT TIME ZONE 'UTC' + interval '25 seconds', "
        "'YYYY-MM-DD\"T\"HH24:MI:SS.US') AS ahead FROM session_queue WHERE item_id = ?",
        (item_id,),
    )[0]
    assert lease["ahead"]  # 30 s from the database's now


def test_a_pause_on_one_server_stops_the_claims_of_every_server(make_server: MakeServer) -> None:
    pausing, other = make_server("p:1"), make_server("o:2")
    (item_id,) = pausing.enqueue_batch("default", integer_batch()).item_ids
    pausing.set_paused(True)
    assert other.is_paused() and other.dequeue() is None
    pausing.set_paused(False)
    claimed = other.dequeue()
    assert claimed is not None and claimed.item_id == item_id


def test_a_processor_takes_items_enqueued_and_resumed_on_another_server(
    make_server: MakeServer, postgres_url: str, tmp_path: Path
) -> None:
    mine, other = make_server("mine:1"), make_server("other:2")
    images_db = PostgresDatabase(postgres_url, pool_size=2)
    processor = SessionProcessor(mine, ImageService(images_db, tmp_path / "out", 1000), EventBus(), poll_seconds=0.05)
    processor.start()
    try:
        other.set_paused(True)
        (item_id,) = other.enqueue_batch("default", integer_batch()).item_ids
        time.sleep(0.3)
        assert _status(other, item_id) == "pending"
        assert not processor.status().is_started  # paused elsewhere: shown here too
        other.set_paused(False)
        wait_until(lambda: _status(other, item_id) == "completed", timeout=5)
    finally:
        processor.stop()
        images_db.close()


def test_sqlite_restart_requeues_interrupted_items_when_asked(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path / "queue.db")
    queue = SessionQueue(db, EventBus(), 100)
    interrupted, waiting = queue.enqueue_batch("default", integer_batch(runs=2)).item_ids
    queue.dequeue()
    db.close()
    for requeue, expected in ((True, "pending"), (False, "canceled")):
        db = SqliteDatabase(tmp_path / "queue.db")
        after = SessionQueue(db, EventBus(), 100, requeue_interrupted=requeue)
        assert after.recover_interrupted() == 1
        item = after.get("default", interrupted)
        assert item.status == expected
        assert item.cancel_reason == (RESTART_REASON if expected == "canceled" else None)
        assert _status(after, waiting) == "pending"
        if requeue:
            after.dequeue()  # runs again, and the server dies again
        db.close()


class _HeldAfterAffinityRead(SessionQueue):
    """A server whose claim stops between its affinity read and its claim until `release` is set: the moment at
    which another server may claim or cancel the item it chose."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.chosen: int | None = None
        self.read_done = threading.Event()
        self.release = threading.Event()

    def _affine_item(self, cursor, on_device):  # type: ignore[no-untyped-def]
        self.chosen = super()._affine_item(cursor, on_device)
        self.read_done.set()
        assert self.release.wait(10)
        return self.chosen


def _model_batch(name: str) -> Batch:
    return Batch(graph=graph({"enc": {"type": "sd_text_encoder", "model": {"name": name}, "prompt": "p"}}))


@pytest.mark.parametrize("meanwhile", ["claimed by another server", "canceled"])
def test_the_affinity_claim_takes_its_item_only_if_still_pending(
    postgres_url: str, make_server: MakeServer, meanwhile: str
) -> None:
    # Server A reads the pending items and prefers X (its model is on A's device); before A's claim, server B claims
    # X (B's affinity read chose X too), or a user cancels X. A must not run X: its claim checks the item is still
    # pending, and A takes the next pending item instead.
    db = PostgresDatabase(postgres_url, pool_size=2)
    try:
        held = _HeldAfterAffinityRead(db, EventBus(), 10_000, server="a:1")
        other = make_server("b:2")
        [older_y] = other.enqueue_batch("default", _model_batch("Y")).item_ids
        [x] = other.enqueue_batch("default", _model_batch("X")).item_ids
        taken: list[object] = []
        thread = threading.Thread(target=lambda: taken.append(held.dequeue("cpu#0", frozenset({"name:x"}))))
        thread.start()
        try:
            assert held.read_done.wait(10) and held.chosen == x
            if meanwhile == "canceled":
                other.cancel("default", x)
            else:
                claimed = other.dequeue("cpu#0", frozenset({"name:x"}))
                assert claimed is not None and claimed.item_id == x
        finally:
            held.release.set()
            thread.join(10)
        [a_item] = taken
        assert a_item is not None and a_item.item_id == older_y  # type: ignore[attr-defined]
        row = other._db.execute("SELECT status, worker FROM session_queue WHERE item_id = ?", (x,))[0]
        expected = ("canceled", None) if meanwhile == "canceled" else ("in_progress", "b:2/cpu#0")
        assert (row["status"], row["worker"]) == expected
    finally:
        db.close()
