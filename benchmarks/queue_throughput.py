"""Session queue throughput and enqueue-to-start latency, against a real `invokeai-web`, in one run.

- throughput: 200 trivial graphs (one `integer` node each) enqueued by 200 back-to-back requests, then as one batch
  of 200 runs; items per second from the first request sent to the last `completed` event received over the event
  stream;
- latency: on an idle queue, one item at a time, the time from sending the enqueue request to receiving the item's
  `in_progress` event (what a client sees), and the server's own started_at - created_at.

The server runs on a fresh root with its SQLite file on disk (the default), on a free port; it is stopped at the
end. Needs the test extra (httpx, httpx-sse): pip install -e '.[test]'.
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
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from _server import free_port, start_server, stop_server, uncached, wait_up
from httpx_sse import connect_sse

QUEUE = "/api/v1/queue/default"
TRIVIAL_GRAPH = uncached({"nodes": {"n": {"id": "n", "type": "integer", "value": 1}}, "edges": []})


class StatusClock:
    """Reads the event stream on a thread; records when each item's in_progress and completed events arrived."""

    def __init__(self, client: httpx.Client) -> None:
        self.started: dict[int, float] = {}
        self.finished: dict[int, float] = {}
        self._changed = threading.Condition()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(client,), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            sys.exit("could not subscribe to the event stream")

    def _read(self, client: httpx.Client) -> None:
        with connect_sse(client, "GET", f"{QUEUE}/events") as source:
            self._ready.set()  # the headers are in: subscribed
            for event in source.iter_sse():
                if event.event != "queue_item_status_changed":
                    continue
                now = time.perf_counter()
                payload = json.loads(event.data)
                with self._changed:
                    if payload["status"] == "in_progress":
                        self.started[payload["item_id"]] = now
                    elif payload["status"] in ("completed", "failed", "canceled"):
                        self.finished[payload["item_id"]] = now
                    self._changed.notify_all()

    def wait(self, marks: dict[int, float], item_ids: list[int], timeout: float = 120) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: all(i in marks for i in item_ids), timeout):
                sys.exit("timed out waiting for items")


def _enqueue_runs(client: httpx.Client, runs: int) -> list[int]:
    response = client.post(f"{QUEUE}/enqueue_batch", json={"batch": {"graph": TRIVIAL_GRAPH, "runs": runs}})
    response.raise_for_status()
    item_ids: list[int] = response.json()["item_ids"]
    return item_ids


def _enqueue(client: httpx.Client) -> int:
    return _enqueue_runs(client, 1)[0]


def _ms(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered) * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms"


def _throughput(client: httpx.Client, clock: StatusClock, count: int) -> None:
    begun = time.perf_counter()
    request_times = []
    item_ids = []
    for _ in range(count):
        sent = time.perf_counter()
        item_ids.append(_enqueue(client))
        request_times.append(time.perf_counter() - sent)
    clock.wait(clock.finished, item_ids)
    elapsed = max(clock.finished[i] for i in item_ids) - begun
    statuses = {client.get(f"{QUEUE}/i/{i}").json()["status"] for i in item_ids}
    print(f"throughput: {count} trivial graphs, one enqueue request each, back to back")
    print(f"  {count / elapsed:.1f} items/s ({elapsed:.2f} s from the first request to the last completion)")
    print(f"  enqueue request round trip: {_ms(request_times)}; final statuses: {sorted(statuses)}")

    begun = time.perf_counter()
    item_ids = _enqueue_runs(client, count)
    clock.wait(clock.finished, item_ids)
    elapsed = max(clock.finished[i] for i in item_ids) - begun
    print(f"  as one batch of {count} runs: {count / elapsed:.1f} items/s ({elapsed:.2f} s)")


def _latency(client: httpx.Client, clock: StatusClock, count: int) -> None:
    seen, server_side = [], []
    for _ in range(count):
        sent = time.perf_counter()
        item_id = _enqueue(client)
        clock.wait(clock.started, [item_id])
        seen.append(clock.started[item_id] - sent)
        clock.wait(clock.finished, [item_id])
        item: dict[str, Any] = client.get(f"{QUEUE}/i/{item_id}").json()
        delta = datetime.fromisoformat(item["started_at"]) - datetime.fromisoformat(item["created_at"])
        server_side.append(delta.total_seconds())
    print(f"enqueue-to-start latency on an idle queue, {count} items one at a time")
    print(f"  client (request sent -> in_progress event received): {_ms(seen)}")
    print(f"  server (started_at - created_at):                     {_ms(server_side)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200, help="graphs for the throughput figure (default 200)")
    parser.add_argument("--latency-items", type=int, default=50, help="items for the latency figure (default 50)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="invokeai-bench-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server(root, port)
    try:
        wait_up(base, process, timeout=120)
        with httpx.Client(base_url=base, timeout=60) as client, httpx.Client(base_url=base, timeout=None) as stream:
            clock = StatusClock(stream)
            _enqueue(client)  # warm-up: first node run, first image-free graph validation
            time.sleep(0.5)
            _throughput(client, clock, args.items)
            _latency(client, clock, args.latency_items)
    finally:
        stop_server(process)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
