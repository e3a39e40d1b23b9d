"""The event relay's delay: from a publish on one server's event bus to its delivery on another's, through
PostgreSQL (LISTEN/NOTIFY), p50 and p95.

Two relays on one database, each with its own bus and connections, as two servers have (in one process, so that
both ends read one clock). Three loads:
- idle: one event at a time, 5 ms apart (what a client of another server waits for a status change);
- a stream: 20 events a second for 10 s, an SD item's steps and status changes;
- a burst: 2000 events published as fast as one thread can, each event's delay and the burst's rate;
and one large event (30 kB, by way of the payload table) at a time.

PostgreSQL: the server --database-url names (a database of its own is created there and dropped after; the role
needs CREATEDB), or, without it, a private server started as tests/postgres_support.py starts the tests'.
Run: python benchmarks/event_relay.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import postgres_support  # noqa: E402  (the tests' private PostgreSQL server, standard library only)

from invokeai.app.services.event_relay import EventRelay  # noqa: E402
from invokeai.app.services.events import EventBase, EventBus, InvocationStartedEvent, QueueItemsCanceledEvent  # noqa: E402


@contextmanager
def database(url: str | None) -> Iterator[str]:
    import psycopg

    with ExitStack() as stack:
        if url is None:
            folder = Path(tempfile.mkdtemp(prefix="event-relay-pg-"))
            stack.callback(postgres_support.stop, folder)
            url = postgres_support.start(folder)
        name = f"event_relay_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield url.rsplit("/", 1)[0] + "/" + name
        finally:
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Arrivals:
    """When each event of a run reached the receiving bus; the relay keeps their order, so the n-th arrival is the
    n-th event sent."""

    def __init__(self, bus: EventBus) -> None:
        self.at: list[float] = []
        self.done = threading.Event()
        self.expected = 0
        bus.add_listener(self._take)

    def _take(self, event: EventBase) -> None:
        self.at.append(time.perf_counter())
        if len(self.at) >= self.expected:
            self.done.set()


def run(bus: EventBus, arrivals: Arrivals, label: str, events: list[EventBase], gap_s: float) -> str:
    arrivals.at.clear()
    arrivals.done.clear()
    arrivals.expected = len(events)
    sent: list[float] = []
    start = time.perf_counter()
    for event in events:
        sent.append(time.perf_counter())
        bus.publish(event)
        if gap_s:
            time.sleep(gap_s)
    if not arrivals.done.wait(120):
        return f"{label}: only {len(arrivals.at)} of {len(events)} events arrived"
    took = time.perf_counter() - start
    delays = sorted(arrived - at for arrived, at in zip(arrivals.at, sent, strict=True))
    p95 = statistics.quantiles(delays, n=20)[18]
    rate = f", {len(events) / took:.0f} events/s" if not gap_s else ""
    return (
        f"{label:<28} p50 {statistics.median(delays) * 1000:6.2f} ms, p95 {p95 * 1000:6.2f} ms "
        f"({len(events)} events{rate})"
    )


def started(queue_id: str, n: int) -> InvocationStartedEvent:
    return InvocationStartedEvent(
        queue_id=queue_id, item_id=n, batch_id="b", session_id="s", node_id="denoise", node_type="sd_denoise"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a PostgreSQL server to use (default: a private one)")
    args = parser.parse_args()
    with database(args.database_url) as url:
        sender_bus, receiver_bus = EventBus(), EventBus()
        relays = [EventRelay(url, sender_bus), EventRelay(url, receiver_bus)]
        for relay in relays:
            relay.start()
        arrivals = Arrivals(receiver_bus)
        try:
            run(sender_bus, arrivals, "warm-up", [started("warm", n) for n in range(50)], 0.001)
            print(run(sender_bus, arrivals, "idle (5 ms apart)", [started("idle", n) for n in range(400)], 0.005))
            print(run(sender_bus, arrivals, "stream (20 a second)", [started("steady", n) for n in range(200)], 0.05))
            print(run(sender_bus, arrivals, "burst", [started("burst", n) for n in range(2000)], 0.0))
            large = [
                QueueItemsCanceledEvent(
                    queue_id="large",
                    item_ids=list(range(n * 10_000, n * 10_000 + 4000)),
                    batch_ids=[],
                    cancel_reason="x",
                )
                for n in range(100)
            ]
            print(run(sender_bus, arrivals, "large (30 kB, via table)", large, 0.005))
        finally:
            for relay in relays:
                relay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
