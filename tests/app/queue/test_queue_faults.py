"""The queue when its database goes away, or one of its servers stops past its lease.

On PostgreSQL, a server of the tests' own is stopped and started (tests/postgres_support.FaultyPostgres): an item
running through an outage ends once with a true reason and never stays in_progress, a database error is never the
node's own, and a server back from an outage leaves the other servers' items alone for a lease. A run resumed after
its item was recovered writes nothing (its claim's token fences it). Leases are short here, so each test takes
seconds."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_support import ENGINES
from PIL import Image
from queue_support import EventRecorder, integer_batch, wait_until

from invokeai.app.nodes.context import InvocationContext
from invokeai.app.nodes.primitives import IntegerInvocation, IntegerOutput
from invokeai.app.services.database import Database
from invokeai.app.services.database_retry import DATABASE_ERRORS
from invokeai.app.services.events import EventBus
from invokeai.app.services.images import ImageService
from invokeai.app.services.postgres import PostgresDatabase
from invokeai.app.services.queue_leases import LeaseKeeper
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import DATABASE_UNREACHABLE_REASON, LEASE_EXPIRED_REASON, SessionQueue

LEASE_S = 1.0


@pytest.fixture
def open_db(faulty_postgres: Any) -> Iterator[Callable[[], PostgresDatabase]]:
    """open_db(): a server's pool on the test's database; a statement waits at most 0.3 s for a connection, so an
    outage shows at once."""
    opened: list[PostgresDatabase] = []

    def make() -> PostgresDatabase:
        db = PostgresDatabase(faulty_postgres.url, pool_size=4, wait_s=0.3)
        opened.append(db)
        return db

    yield make
    faulty_postgres.resume()
    for db in opened:
        db.close()


def _read(call: Callable[[], Any], timeout: float = 10.0) -> Any:
    """call() once the database answers (the pool may still be reconnecting just after a restart)."""

    def attempt() -> Any:
        try:
            return (call(),)
        except DATABASE_ERRORS:
            return None

    return wait_until(attempt, timeout, "the database to answer")[0]


@pytest.mark.parametrize("where", ["at completion", "at a cancel check", "in the node's own statement"])
def test_an_outage_while_an_item_runs_ends_it_with_the_reason_not_as_the_nodes_error(
    faulty_postgres: Any,
    open_db: Callable[[], PostgresDatabase],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    where: str,
) -> None:
    # The node's last act is to stop the database, as a restart would: recording its end (or its next cancel check)
    # fails for longer than the worker's retries. The item must neither stay in_progress (its lease renewed for
    # ever) nor fail with the database's error as if the node had raised it.
    def invoke(self: IntegerInvocation, context: InvocationContext) -> IntegerOutput:
        faulty_postgres.halt()
        if where == "at a cancel check":
            context.progress(1, 2)
        elif where == "in the node's own statement":
            try:
                db.execute("SELECT 1")  # as a node saving an image would: it fails, and the node raises that
            finally:
                faulty_postgres.resume()  # back before the worker looks at the error
        return IntegerOutput(value=self.value)

    IntegerInvocation.output_class()
    monkeypatch.setattr(IntegerInvocation, "invoke", invoke)
    db = open_db()
    events = EventBus()
    recorder = EventRecorder()
    events.add_listener(recorder)
    queue = SessionQueue(db, events, 100, lease_seconds=LEASE_S)
    processor = SessionProcessor(queue, ImageService(db, tmp_path / "out", 1000), events, poll_seconds=0.05)
    keeper = LeaseKeeper(queue, period=0.2)
    (item_id,) = queue.enqueue_batch("default", integer_batch()).item_ids
    processor.start()
    keeper.start()
    try:
        recorder.wait_event(item_id, "invocation_started")
        # The worker retries for a lease, then lets the item go: its lease is no longer renewed.
        wait_until(lambda: not processor.workers()[0].busy, timeout=10, what="the worker to let the item go")
        assert queue.running_here() == {}
        faulty_postgres.resume()
        item = wait_until(
            lambda: (found := _read(lambda: queue.get("default", item_id))).status != "in_progress" and found,
            timeout=10,
            what="the item to end",
        )
    finally:
        keeper.stop()
        processor.stop()
    assert (item.status, item.cancel_reason, item.error_type) == ("canceled", DATABASE_UNREACHABLE_REASON, None)
    assert "invocation_error" not in recorder.names(item_id)


@pytest.mark.parametrize("where", ["at completion", "at a cancel check"])
def test_an_outage_shorter_than_the_lease_is_waited_out(
    faulty_postgres: Any,
    open_db: Callable[[], PostgresDatabase],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    where: str,
) -> None:
    # The database goes away as the node ends and comes back a moment later (a restart): the worker retries, and
    # the item completes as if nothing happened.
    def invoke(self: IntegerInvocation, context: InvocationContext) -> IntegerOutput:
        faulty_postgres.halt()
        threading.Thread(target=faulty_postgres.resume).start()
        if where == "at a cancel check":
            context.progress(1, 2)
        return IntegerOutput(value=self.value)

    IntegerInvocation.output_class()
    monkeypatch.setattr(IntegerInvocation, "invoke", invoke)
    db = open_db()
    events = EventBus()
    recorder = EventRecorder()
    events.add_listener(recorder)
    queue = SessionQueue(db, events, 100, lease_seconds=8.0)
    processor = SessionProcessor(queue, ImageService(db, tmp_path / "out", 1000), events, poll_seconds=0.05)
    (item_id,) = queue.enqueue_batch("default", integer_batch()).item_ids
    processor.start()
    try:
        recorder.wait_status(item_id, "completed", "failed", "canceled", timeout=15)
    finally:
        processor.stop()
    item = _read(lambda: queue.get("default", item_id))
    assert (item.status, item.error_type, item.cancel_reason) == ("completed", None, None)


def test_a_server_back_from_an_outage_waits_a_lease_before_sweeping(
    faulty_postgres: Any, open_db: Callable[[], PostgresDatabase]
) -> None:
    # Every server lost the database for longer than the lease, so every lease ran out. The first server back must
    # not sweep the items of the others, alive and about to renew; a server that really stopped is swept a lease
    # later.
    alive, sweeper, dead = (
        SessionQueue(open_db(), EventBus(), 100, lease_seconds=LEASE_S, server=name) for name in ("a:1", "s:2", "d:3")
    )
    running, orphaned = alive.enqueue_batch("default", integer_batch(runs=2)).item_ids
    assert alive.dequeue() is not None and dead.dequeue() is not None
    alive_keeper, sweeper_keeper = LeaseKeeper(alive), LeaseKeeper(sweeper)
    assert sweeper_keeper.run_once() == 0
    faulty_postgres.halt()
    for keeper in (alive_keeper, sweeper_keeper):
        with pytest.raises(DATABASE_ERRORS):
            keeper.run_once()
    time.sleep(LEASE_S + 0.2)
    faulty_postgres.resume()
    assert _read(sweeper_keeper.run_once) == 0  # every lease has run out, and none is swept yet
    reconnected = time.monotonic()
    _read(alive_keeper.run_once)
    recovered = 0
    while not recovered and time.monotonic() < reconnected + 5:
        recovered = alive_keeper.run_once() + sweeper_keeper.run_once()
        time.sleep(0.0 if recovered else 0.2)
    assert recovered == 1 and time.monotonic() >= reconnected + LEASE_S  # the stopped server's item, a lease later
    statuses = {item.item_id: item.status for item in alive.list_all("default")}
    assert statuses == {running: "in_progress", orphaned: "canceled"}


def test_a_worker_that_cannot_claim_logs_once_per_outage_and_claims_again(
    faulty_postgres: Any,
    open_db: Callable[[], PostgresDatabase],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = open_db()
    events = EventBus()
    recorder = EventRecorder()
    events.add_listener(recorder)
    queue = SessionQueue(db, events, 100, lease_seconds=LEASE_S)
    processor = SessionProcessor(queue, ImageService(db, tmp_path / "out", 1000), events, poll_seconds=0.05)
    processor.start()
    try:
        with caplog.at_level(logging.INFO, logger="invokeai.app.services.session_processor"):
            faulty_postgres.halt()
            time.sleep(1.5)  # many failed claims
            faulty_postgres.resume()
            (item_id,) = _read(lambda: queue.enqueue_batch("default", integer_batch())).item_ids
            recorder.wait_status(item_id, "completed")
    finally:
        processor.stop()
    lost = [r for r in caplog.records if "cannot claim" in r.getMessage()]
    again = [r for r in caplog.records if "claims queue items again" in r.getMessage()]
    assert (len(lost), len(again)) == (1, 1)
    assert not [r for r in caplog.records if r.exc_info]  # no traceback per try


@pytest.mark.parametrize("saves", [True, False], ids=["saving an image", "returning"])
@pytest.mark.parametrize("requeue", [False, True], ids=["canceled", "requeued and claimed again"])
@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_a_run_resumed_past_its_lease_writes_nothing_and_sends_nothing(
    db: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, requeue: bool, saves: bool
) -> None:
    # A server stops (SIGSTOP, a long GC pause, a VM migration) in its node, just before saving the image, for
    # longer than its lease. Another server recovers the item (and, with requeue_interrupted, a worker of the same
    # name claims it again: only the claim's token tells the runs apart). When the first resumes, its image is not
    # recorded and its file removed, it sends no invocation_complete, and it neither finishes nor cancels the item.
    entered, resume = threading.Event(), threading.Event()

    def invoke(self: IntegerInvocation, context: InvocationContext) -> IntegerOutput:
        entered.set()
        assert resume.wait(10)
        if saves:
            context.save_image(Image.new("RGB", (8, 8), "red"))
        return IntegerOutput(value=self.value)

    IntegerInvocation.output_class()
    monkeypatch.setattr(IntegerInvocation, "invoke", invoke)
    events = EventBus()
    recorder = EventRecorder()
    events.add_listener(recorder)
    outputs = tmp_path / "out"
    stopped = SessionQueue(db, events, 100, lease_seconds=0.5, requeue_interrupted=requeue, server="h:1")
    other = SessionQueue(db, EventBus(), 100, lease_seconds=30, requeue_interrupted=requeue, server="h:1")
    processor = SessionProcessor(stopped, ImageService(db, outputs, 1000), events, poll_seconds=0.05)
    (item_id,) = stopped.enqueue_batch("default", integer_batch()).item_ids
    processor.start()
    try:
        assert entered.wait(10)
        time.sleep(0.6)  # no renewal: the server is stopped
        assert other.recover_expired() == 1
        if requeue:
            rerun = other.dequeue("cpu#0")
            assert rerun is not None and rerun.worker == stopped.get("default", item_id).worker
        resume.set()
        wait_until(lambda: not processor.workers()[0].busy, timeout=10, what="the resumed run to stop")
    finally:
        resume.set()
        processor.stop()
    assert db.execute("SELECT COUNT(*) AS n FROM images")[0]["n"] == 0
    assert [p.name for p in outputs.iterdir() if p.is_file()] == []
    assert "invocation_complete" not in recorder.names(item_id)
    item = other.get("default", item_id)
    if requeue:
        assert item.status == "in_progress" and other.complete(item_id, {})
    else:
        assert (item.status, item.cancel_reason) == ("canceled", LEASE_EXPIRED_REASON)


def test_a_restart_of_the_database_under_load_ends_every_item_once_with_a_true_reason(
    faulty_postgres: Any,
    open_db: Callable[[], PostgresDatabase],
    tmp_path: Path,
    scripted_integer_node: list[str],
) -> None:
    # Two servers run short items (5 steps of 10 ms, each a cancel check) while PostgreSQL restarts (pg_ctl restart,
    # every connection terminated). Every item ends once; none fails for the database; none stays in_progress.
    servers = []
    for name in ("a:1", "b:2"):
        db = open_db()
        events = EventBus()
        recorder = EventRecorder()
        events.add_listener(recorder)
        queue = SessionQueue(db, events, 1000, lease_seconds=3.0, server=name)
        processor = SessionProcessor(queue, ImageService(db, tmp_path / name, 1000), events, poll_seconds=0.05)
        servers.append((queue, processor, LeaseKeeper(queue, period=0.5), recorder))
    ids = servers[0][0].enqueue_batch("default", integer_batch(5, runs=40)).item_ids
    for _, processor, keeper, _ in servers:
        processor.start()
        keeper.start()
    try:
        wait_until(lambda: len(servers[0][3].events) + len(servers[1][3].events) > 20, what="items to run")
        ended_before = sum(r.names(i).count("invocation_complete") for _, _, _, r in servers for i in ids)
        faulty_postgres.restart()
        assert ended_before < len(ids) / 2  # the restart came while items ran
        queue = servers[0][0]

        def settled() -> bool:
            counts = _read(lambda: queue.counts_by_status("default"))
            return counts["pending"] == 0 and counts["in_progress"] == 0

        wait_until(settled, timeout=30, what="every item to end")
    finally:
        for _, processor, keeper, _ in servers:
            keeper.stop()
            processor.stop()
    items = {item.item_id: item for item in _read(lambda: queue.list_all("default"))}
    assert sorted(items) == sorted(ids)
    true_reasons = {None, DATABASE_UNREACHABLE_REASON, LEASE_EXPIRED_REASON}
    assert {(item.status, item.cancel_reason in true_reasons) for item in items.values()} <= {
        ("completed", True),
        ("canceled", True),
    }
    ends = [
        e.item_id
        for _, _, _, recorder in servers
        for e in recorder.events
        if getattr(e, "status", None) in ("completed", "canceled", "failed")
    ]
    assert sorted(ends) == sorted(ids)  # each item's end announced once, by the server that ended it
