"""How the queue scales over server processes sharing one PostgreSQL database, in one run.

- trivial items (one `integer` node each), enqueued round robin through every server: items per second from the
  first item's start to the last one's completion (the servers' own timestamps), with 1, 2 and 4 `invokeai-web`
  processes on one PostgreSQL database, and with one process on its SQLite file (the default);
- the claim gap: on each worker, the time from finishing one item to starting the next while items are waiting
  (the claim transaction, its wake-up and the item's start), p50 and p95, from the items' own timestamps;
- demo SD items (demo-sd1, 64x64, 20 steps, one torch thread per process): items per second with 1 and 2 processes
  on PostgreSQL, and with 2 processes that share nothing (each its own SQLite queue: the machine's ceiling).
  Target: 2 processes reach at least 1.7 times the throughput of one (PASS or FAIL on the last line).

Each figure is the best of three rounds on the same servers. Every server has its own root; the servers of one run
share outputs_dir and models_dir (as hosts would share a mount, docs/scale.md). PostgreSQL: the server
--database-url names (the benchmark creates a database of its own per run there and drops it after; the role needs
CREATEDB), or, without it, a private server started as tests/postgres_support.py starts the tests' (Debian's
binaries, as the postgres user, 127.0.0.1).
Run: python benchmarks/queue_scale.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from _server import free_port, start_server, stop_server, uncached, wait_up

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import postgres_support  # noqa: E402  (the tests' private PostgreSQL server, standard library only)

QUEUE = "/api/v1/queue/default"
TRIVIAL_GRAPH = uncached({"nodes": {"n": {"id": "n", "type": "integer", "value": 1}}, "edges": []})
SD_TARGET = 1.7
ROUNDS = 3
FINISHED = ("completed", "failed", "canceled")


def sd_graph() -> dict[str, Any]:
    """The documented demo SD graph (docs/examples), 64x64 and 20 steps."""
    body = json.loads((REPO / "docs" / "examples" / "sd_text_to_image.json").read_text())
    graph: dict[str, Any] = body["batch"]["graph"]
    graph["nodes"]["denoise"].update(width=64, height=64, steps=20)
    return uncached(graph)


class Cluster:
    """`count` invokeai-web processes, each on its own root, on one database (None: each its own SQLite file)."""

    def __init__(self, count: int, database_url: str | None, shared: Path, demo_models: bool) -> None:
        self.shared = shared
        self.database_url = database_url
        self.demo_models = demo_models
        # Without a database_url each server keeps its own SQLite queue: the machine's ceiling, nothing shared.
        self.separate = database_url is None and count > 1
        self.processes: list[Any] = []
        self.bases: list[str] = []
        for index in range(count):
            self._start(index)

    def _start(self, index: int) -> None:
        root = self.shared / f"root-{index}"
        root.mkdir()
        lines = [
            f"outputs_dir: {self.shared / 'outputs'}",
            f"models_dir: {self.shared / 'models'}",
            f"install_demo_models: {'true' if self.demo_models else 'false'}",
        ]
        if self.database_url:
            lines.append(f"database_url: {self.database_url}")
        (root / "invokeai.yaml").write_text("\n".join(lines) + "\n")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        # One torch thread per process: two processes on two cores then share nothing but the database.
        process = start_server(root, port, threads=1)
        self.processes.append(process)
        # The first server installs the demo models into the shared models_dir; the others find them recorded.
        wait_up(base, process, 180)
        self.bases.append(base)

    def stop(self) -> None:
        for process in self.processes:
            stop_server(process)


def enqueue(client: httpx.Client, base: str, graph: dict[str, Any], runs: int, seeds: list[int] | None) -> list[int]:
    batch: dict[str, Any] = {"graph": graph, "runs": runs}
    if seeds:
        batch["data"] = [[{"node_path": "denoise", "field_name": "seed", "items": seeds}]]
    response = client.post(f"{base}{QUEUE}/enqueue_batch", json={"batch": batch}, timeout=60)
    response.raise_for_status()
    return list(response.json()["item_ids"])


def items(client: httpx.Client, base: str) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    offset = 0
    while True:
        page = client.get(f"{base}{QUEUE}/list", params={"offset": offset, "limit": 500}, timeout=30).json()
        found.update({item["item_id"]: item for item in page["items"]})
        if len(page["items"]) < 500:
            return found
        offset += 500


def finished_count(client: httpx.Client, base: str) -> int:
    counts = client.get(f"{base}{QUEUE}/status", timeout=30).json()["queue"]
    return sum(int(counts[status]) for status in FINISHED)


def run_items(cluster: Cluster, count: int, graph: dict[str, Any], batch: int, sd: bool) -> dict[str, Any]:
    """Enqueue `count` items in batches of `batch`, round robin over the servers; wait for all to finish."""
    queues = cluster.bases if cluster.separate else cluster.bases[:1]
    with httpx.Client() as client:
        # Items of an earlier run (the warm-up) are finished already: count from where they left the queue.
        before = sum(finished_count(client, base) for base in queues)
        started = time.perf_counter()
        wanted: set[tuple[int, int]] = set()  # (queue, item id): separate queues number their items alike
        for n in range(0, count, batch):
            size = min(batch, count - n)
            seeds = list(range(n, n + size)) if sd else None
            server = (n // batch) % len(cluster.bases)
            queue = server if cluster.separate else 0
            made = enqueue(client, cluster.bases[server], graph, 1 if sd else size, seeds)
            wanted |= {(queue, item_id) for item_id in made}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if sum(finished_count(client, base) for base in queues) - before >= len(wanted):
                break
            time.sleep(0.1)
        elapsed = time.perf_counter() - started
        found = {
            (queue, item_id): item
            for queue, base in enumerate(queues)
            for item_id, item in items(client, base).items()
            if (queue, item_id) in wanted
        }
    statuses = defaultdict(int)
    for item in found.values():
        statuses[item["status"]] += 1
    if statuses.get("completed", 0) != len(wanted):
        sys.exit(f"not every item completed: {dict(statuses)}")
    # The servers' own span, first start to last completion: the client's enqueue requests and its polling are
    # no part of the queue's throughput, and on a run of a few seconds they would weigh.
    span = max(_when(i["completed_at"]) for i in found.values()) - min(_when(i["started_at"]) for i in found.values())
    return {"rate": len(wanted) / span, "span": span, "elapsed": elapsed, "gaps": claim_gaps(found.values())}


def _when(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def claim_gaps(found: Any) -> list[float]:
    """Per worker, started_at of each item minus completed_at of the one it finished before (seconds)."""
    by_worker: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for item in found:
        if item.get("worker") and item.get("started_at") and item.get("completed_at"):
            by_worker[item["worker"]].append((_when(item["started_at"]), _when(item["completed_at"])))
    gaps = []
    for runs in by_worker.values():
        runs.sort()
        gaps += [start - previous_end for (_, previous_end), (start, _) in itertools.pairwise(runs)]
    return gaps


def ms(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a (fewer than two gaps)"
    cuts = statistics.quantiles(values, n=20)
    return f"p50 {statistics.median(values) * 1000:.1f} ms, p95 {cuts[18] * 1000:.1f} ms ({len(values)} gaps)"


@contextmanager
def postgres(url: str | None) -> Any:
    """Yields a function making a new empty database on the server (dropped at the end) and returning its URL."""
    import psycopg

    with ExitStack() as stack:
        if url is None:
            folder = Path(tempfile.mkdtemp(prefix="queue-scale-pg-"))
            stack.callback(postgres_support.stop, folder)
            url = postgres_support.start(folder)
        made: list[str] = []

        def fresh() -> str:
            name = f"queue_scale_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            made.append(name)
            return url.rsplit("/", 1)[0] + "/" + name

        try:
            yield fresh
        finally:
            with psycopg.connect(url, autocommit=True) as admin:
                for name in made:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def warm_up(cluster: Cluster, graph: dict[str, Any]) -> None:
    """Run SD items until every server's worker has completed one (its models loaded)."""
    for _ in range(5):
        run_items(cluster, 2 * len(cluster.bases), graph, 1, sd=True)
        done = [
            sum(w["items_completed"] for w in httpx.get(f"{base}/api/v1/app/devices", timeout=30).json()["workers"])
            for base in cluster.bases
        ]
        if all(done):
            return
    sys.exit(f"a server never took a warm-up item: {done}")


def measure(label: str, count: int, database_url: str | None, graph: dict[str, Any], n: int, sd: bool) -> dict:
    shared = Path(tempfile.mkdtemp(prefix="queue-scale-"))
    try:
        cluster = Cluster(count, database_url, shared, demo_models=sd)
        try:
            if sd:  # the first item of each process loads the model: warm them all before the clock starts
                warm_up(cluster, graph)
            # The best of a few rounds: on a shared machine a round is only ever slowed down by something else.
            result = max(
                (run_items(cluster, n, graph, 1 if sd else 10, sd) for _ in range(ROUNDS)), key=lambda r: r["rate"]
            )
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    print(
        f"  {label:<28} {result['rate']:8.1f} items/s  (best of {ROUNDS}: {n} items in {result['span']:.2f} s from "
        f"the first start to the last completion, {result['elapsed']:.2f} s from the first request); claim gap "
        f"{ms(result['gaps'])}",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="a PostgreSQL server to create the benchmark's databases on")
    parser.add_argument("--quick", action="store_true", help="fewer items (a smoke run of every part)")
    parser.add_argument("--items", type=int, default=None, help="trivial items per run (400; --quick 200)")
    parser.add_argument("--sd-items", type=int, default=None, help="demo SD items per run (16; --quick 8)")
    args = parser.parse_args()
    trivial = args.items or (200 if args.quick else 400)
    sd_items = args.sd_items or (8 if args.quick else 16)
    with postgres(args.database_url) as fresh_database:
        print(f"trivial items ({trivial} per run, `integer` nodes, batches of 10 round robin over the servers)")
        sqlite = measure("1 server, SQLite", 1, None, TRIVIAL_GRAPH, trivial, sd=False)
        rates = {}
        for count in (1, 2, 4):
            rates[count] = measure(
                f"{count} server(s), PostgreSQL", count, fresh_database(), TRIVIAL_GRAPH, trivial, sd=False
            )["rate"]
        print(
            f"  ratio PostgreSQL 1 server / SQLite: {rates[1] / sqlite['rate']:.2f}x; 2 servers / 1: "
            f"{rates[2] / rates[1]:.2f}x; 4 servers / 1: {rates[4] / rates[1]:.2f}x"
        )
        print(f"demo SD items ({sd_items} per run, 64x64, 20 steps, one torch thread per process, PostgreSQL)")
        graph = sd_graph()
        one = measure("1 server", 1, fresh_database(), graph, sd_items, sd=True)["rate"]
        two = measure("2 servers", 2, fresh_database(), graph, sd_items, sd=True)["rate"]
        ratio = two / one
        apart = measure("2 servers, separate SQLite", 2, None, graph, sd_items, sd=True)["rate"]
        print(
            f"  the machine's ceiling, 2 servers sharing nothing / 1 server: {apart / one:.2f}x; the shared queue "
            f"keeps {two / apart:.0%} of it"
        )
    verdict = "PASS" if ratio >= SD_TARGET else "FAIL"
    print(f"SD throughput ratio, 2 servers / 1: {ratio:.2f}x (target >= {SD_TARGET}x): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
