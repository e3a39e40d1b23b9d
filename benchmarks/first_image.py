"""The first image after a restart against a warm one, on each family's demo model, through the REST API.

For each family (its documented text-to-image example on its demo pipeline, every node uncached, as
benchmarks/generation.py runs it): the server is started on one root (the first start installs the demo models),
the example is run once (so that it is what the last completed item used), the server is stopped and started again
on the same root, the example is enqueued the moment the server answers (`first`), then run `--warm` more times
(`warm`: the fastest). It prints, per family, the restart (seconds until the server answered), first, warm and
first/warm, all measured in this one run. Target: first <= 2x warm (docs/performance.md, "The first image").

    python benchmarks/first_image.py [--only sd-1] [--warm 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

TARGET = 2.0
QUEUE = "/api/v1/queue/default"


def run_item(client: httpx.Client, body: dict[str, Any], timeout: float = 600) -> float:
    """Seconds from the enqueue request to the item's completion (polled every 20 ms)."""
    started = time.perf_counter()
    item_id = client.post(f"{QUEUE}/enqueue_batch", json=body).json()["item_ids"][0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = client.get(f"{QUEUE}/i/{item_id}").json()
        if item["status"] == "completed":
            return time.perf_counter() - started
        if item["status"] in ("failed", "canceled"):
            sys.exit(f"item {item_id} {item['status']}: {item.get('error_message')}")
        time.sleep(0.02)
    sys.exit(f"item {item_id} did not finish within {timeout:g} s")


def up_soon(base: str, process: Any, timeout: float = 300) -> float:
    """Seconds until the server answers /api/v1/app/version, polled every 50 ms, so the first item follows closely."""
    started = time.perf_counter()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"invokeai-web exited with {process.returncode}")
        try:
            httpx.get(f"{base}/api/v1/app/version", timeout=5)
            return time.perf_counter() - started
        except httpx.TransportError:
            time.sleep(0.05)
    sys.exit(f"invokeai-web did not answer within {timeout:g} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="a family (repeatable); default: every family")
    parser.add_argument("--warm", type=int, default=3, help="warm items after the first (the fastest counts)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the server (default 1)")
    args = parser.parse_args()

    # Imported after --help: the cases come from the family registry, which imports torch.
    from _server import free_port, start_server, stop_server
    from generation import CASES

    cases = [case for case in CASES if not args.only or case.family in args.only]
    if not cases:
        sys.exit(f"no family among {args.only}; the families: {', '.join(case.family for case in CASES)}")
    root = Path(tempfile.mkdtemp(prefix="first-image-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    rows = []
    with httpx.Client(base_url=base, timeout=60) as client:
        process = start_server(root, port, args.threads)
        fresh = up_soon(base, process)
        stop_server(process)
        print(f"fresh start (demo models installed): {fresh:.2f} s on {args.threads} thread(s)", flush=True)
        for case in cases:
            process = start_server(root, port, args.threads)
            up_soon(base, process)
            run_item(client, case.body)  # what the last completed item used: this family's model
            stop_server(process)
            process = start_server(root, port, args.threads)
            try:
                restart = up_soon(base, process)
                first = run_item(client, case.body)
                warm = min(run_item(client, case.body) for _ in range(args.warm))
            finally:
                stop_server(process)
            rows.append((case.family, restart, first, warm))
            print(f"  {case.family}: restart {restart:.2f} s, first {first:.2f} s, warm {warm:.2f} s", flush=True)
    print()
    print("| family | restart (s) | first after restart (s) | warm (s) | first/warm |")
    print("|---|---:|---:|---:|---:|")
    for family, restart, first, warm in rows:
        print(f"| {family} | {restart:.2f} | {first:.2f} | {warm:.2f} | {first / warm:.2f} |")
    worst = max(first / warm for _, _, first, warm in rows)
    print(f"\nworst first/warm {worst:.2f}: {'PASS' if worst <= TARGET else 'OVER'} (target <= {TARGET:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
