"""Two servers' services on one PostgreSQL database, in one process: an enqueue on one wakes the other's worker at
once through the event relay (not at its next poll), and the first sees the events of the item the other ran. With
SQLite no relay is built."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from queue_support import EventRecorder, integer_batch, wait_until

from invokeai.app.config import InvokeAIAppConfig
from invokeai.app.services import container
from invokeai.app.services.container import Services, build_services
from invokeai.app.services.events import EventBus, QueueItemStatusChangedEvent


def test_sqlite_runs_no_relay(tmp_path: Path) -> None:
    config = InvokeAIAppConfig.located({"use_memory_db": True}, tmp_path / "root", None)
    services = build_services(config, EventBus())
    try:
        assert services.relay is None
    finally:
        services.db.close()


@pytest.fixture
def start_server(postgres_url: str, tmp_path: Path) -> Iterator[Callable[[str, bool], Services]]:
    started: list[Services] = []

    def start(name: str, run_processor: bool) -> Services:
        settings = {"database_url": postgres_url, "outputs_dir": str(tmp_path / "shared-outputs")}
        config = InvokeAIAppConfig.located(settings, tmp_path / name, None)
        services = build_services(config, EventBus())
        services.start(run_processor=run_processor)
        started.append(services)
        return services

    yield start
    for services in reversed(started):
        services.stop()


def test_an_enqueue_on_one_server_starts_at_once_on_another_whose_events_reach_the_first(
    start_server: Callable[[str, bool], Services], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's own poll, made too slow to matter: only the relayed batch_enqueued can wake it in time.
    monkeypatch.setattr(container, "POSTGRES_POLL_SECONDS", 60.0)
    a = start_server("a", False)
    b = start_server("b", True)
    assert a.relay is not None and b.relay is not None
    seen_on_a = EventRecorder()
    a.events.add_listener(seen_on_a)
    delays = []
    for _ in range(5):
        enqueued = time.perf_counter()
        [item_id] = a.queue.enqueue_batch("default", integer_batch()).item_ids

        def statuses(item_id: int = item_id) -> list[str]:
            return [e.status for e in seen_on_a.of_item(item_id) if isinstance(e, QueueItemStatusChangedEvent)]

        wait_until(lambda: "in_progress" in statuses(), timeout=10, what="the start on B, seen on A")
        delays.append(time.perf_counter() - enqueued)
        wait_until(lambda: "completed" in statuses(), timeout=10, what="the end on B, seen on A")
        time.sleep(0.05)
        assert statuses() == ["in_progress", "completed"]  # each once (A's own enqueue publishes no status)
    # From the enqueue on A to the start on B, as A's subscribers see it: well under the poll.
    assert statistics.median(delays) < 1.0, delays


@pytest.mark.parametrize("sender", ["working", "dead right after the commit"])
def test_an_items_end_reaches_the_other_server_once_and_after_its_node_events(
    start_server: Callable[[str, bool], Services], sender: str
) -> None:
    # The status change and its event commit together: a server killed a moment after an item's completion (its
    # relay's sender, which sends 50 ms later, never runs again) cannot keep the other servers from seeing it.
    a = start_server("a", False)
    b = start_server("b", True)
    assert b.relay is not None
    if sender != "working":
        b.relay._send = lambda conn, batch: None  # type: ignore[method-assign]
    seen_on_a = EventRecorder()
    a.events.add_listener(seen_on_a)
    [item_id] = a.queue.enqueue_batch("default", integer_batch()).item_ids
    assert seen_on_a.wait_status(item_id, "completed") == "completed"
    time.sleep(0.3)  # time for a repeat to show
    changes = [e for e in seen_on_a.of_item(item_id) if isinstance(e, QueueItemStatusChangedEvent)]
    assert [e.status for e in changes if e.status == "completed"] == ["completed"]
    if sender == "working":
        names = [name for name in seen_on_a.names(item_id) if name != "invocation_progress"]
        assert names == [
            "queue_item_status_changed",
            "invocation_started",
            "invocation_complete",
            "queue_item_status_changed",
        ]
