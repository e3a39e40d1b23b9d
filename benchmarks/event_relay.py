"""The event relay's delay: from a publish on one server's event bus to its delivery on another's, through
PostgreSQL (LISTEN/NOTIFY), p50 and p95.

Two relays on one database, each with its own bus and connections, as two servers have (in one process, so that
both ends read one clock). Three loads:
- idle: one event at a time, 5 ms apart (what a client of another server waits for a status change);
- a stream: 20 events a second for 10 s, an SD item's steps and status changes;
- a burst: 2000 events published as fast as one thread can, each event's delay and the burst's rate;
and one large event (30 kB, by way of the payload table) at a time.

--servers: end to end instead, two `invokeai-web` processes on one database with a client on each one's event
stream: 200 trivial items, enqueued 10 at a time through either; for each status change, the time between its
arrival on the two streams (that of the server running the item, and that of the other).

PostgreSQL: the server --database-url names (a database of its own is created there and dropped after; the role
needs CREATEDB), or, without it, a private server started as tests/postgres_support.py starts the tests'.
Run: python benchmarks/event_relay.py [--servers]
"""

from __future__ import annotations

import argparse
import json
import shutil
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
        queue_id=queue_id, item_id=n, batch_id="b", session_id="s", node_id="denoise", node_type="sd_denoise",
        invocation={"id": "denoise", "type": "sd_denoise"},
    )  # fmt: skip


class Stream:
    """A client of one server's event stream (status changes only), read on a thread: when each arrived."""

    def __init__(self, base: str) -> None:
        import httpx

        self.at: dict[tuple[int, str], float] = {}
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=None))
        self._open = threading.Event()
        threading.Thread(target=self._read, args=(base,), daemon=True).start()
        if not self._open.wait(30):
            sys.exit(f"could not subscribe to {base}")

    def _read(self, base: str) -> None:
        import httpx

        url = f"{base}/api/v1/queue/default/events?event=queue_item_status_changed"
        try:
            with self._client.stream("GET", url) as response:
                self._open.set()
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        payload = json.loads(line[5:])
                        self.at[(payload["item_id"], payload["status"])] = time.perf_counter()
        except httpx.HTTPError:
            pass  # closed at the end

    def close(self) -> None:
        self._client.close()


def across_servers(url: str) -> None:
    import httpx
    from _server import free_port, start_server, stop_server, wait_up

    shared = Path(tempfile.mkdtemp(prefix="event-relay-servers-"))
    processes, bases = [], []
    try:
        for index in range(2):
            root = shared / f"root-{index}"
            root.mkdir()
            (root / "invokeai.yaml").write_text(
                f"database_url: {url}\noutputs_dir: {shared / 'outputs'}\ninstall_demo_models: false\n"
            )
            port = free_port()
            processes.append(start_server(root, port, threads=1))
            bases.append(f"http://127.0.0.1:{port}")
            wait_up(bases[-1], processes[-1], 180)
        streams = [Stream(base) for base in bases]
        graph = {"nodes": {"n": {"id": "n", "type": "integer", "value": 1}}, "edges": []}
        ids: list[int] = []
        with httpx.Client(timeout=30) as client:
            for n in range(20):
                response = client.post(
                    f"{bases[n % 2]}/api/v1/queue/default/enqueue_batch", json={"batch": {"graph": graph, "runs": 10}}
                )
                ids += response.json()["item_ids"]
                time.sleep(0.1)
        wanted = {(item_id, status) for item_id in ids for status in ("in_progress", "completed")}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(wanted <= set(stream.at) for stream in streams):
            time.sleep(0.05)
        for stream in streams:
            stream.close()
        both = [key for key in wanted if all(key in stream.at for stream in streams)]
        delays = sorted(abs(streams[0].at[key] - streams[1].at[key]) for key in both)
        p95 = statistics.quantiles(delays, n=20)[18]
        print(
            f"{'two servers, event streams':<28} p50 {statistics.median(delays) * 1000:6.2f} ms, p95 "
            f"{p95 * 1000:6.2f} ms ({len(both)} of {len(wanted)} status changes on both streams)"
        )
    finally:
        for process in processes:
            stop_server(process)
        shutil.rmtree(shared, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="a PostgreSQL server to use (default: a private one)")
    parser.add_argument("--servers", action="store_true", help="end to end: two invokeai-web processes")
    args = parser.parse_args()
    with database(args.database_url) as url:
        if args.servers:
            across_servers(url)
            return 0
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
