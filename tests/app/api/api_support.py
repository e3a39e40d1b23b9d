"""Helpers for the API tests (importable by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from httpx_sse import connect_sse
from wait_support import wait_until

MakeClient = Callable[..., TestClient]

QUEUE = "/api/v1/queue/default"
FINISHED = ("completed", "failed", "canceled")


def node(node_id: str, type_: str, **inputs: Any) -> dict[str, Any]:
    return {"id": node_id, "type": type_, **inputs}


def edge(source: str, source_field: str, destination: str, destination_field: str) -> dict[str, Any]:
    return {
        "source": {"node_id": source, "field": source_field},
        "destination": {"node_id": destination, "field": destination_field},
    }


def graph_json(*nodes: dict[str, Any], edges: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"id": "g", "nodes": {n["id"]: n for n in nodes}, "edges": edges or []}


IMAGE_GRAPH = graph_json(
    node("blank", "blank_image", width=48, height=32, color="#ff0000"),
    node("resize", "image_resize", width=24, height=16),
    edges=[edge("blank", "image", "resize", "image")],
)


# About a second per node on a laptop core: long enough to cancel, SIGKILL or SIGTERM the server in the middle.
SLOW_GRAPH = graph_json(
    node("blank", "blank_image", width=4096, height=4096, color="#336699"),
    node("big1", "image_resize", width=4000, height=4000),
    node("big2", "image_resize", width=3900, height=3900),
    node("big3", "image_resize", width=3800, height=3800),
    edges=[
        edge("blank", "image", "big1", "image"),
        edge("big1", "image", "big2", "image"),
        edge("big2", "image", "big3", "image"),
    ],
)


def enqueue(client: TestClient, graph: dict[str, Any], runs: int = 1, **batch: Any) -> Any:
    return client.post(f"{QUEUE}/enqueue_batch", json={"batch": {"graph": graph, "runs": runs, **batch}})


def wait_finished(client: TestClient, item_id: int, timeout: float = 10.0) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        item: dict[str, Any] = client.get(f"{QUEUE}/i/{item_id}").json()
        return item if item["status"] in FINISHED else None

    return wait_until(finished, timeout, f"item {item_id} to finish")


class ServerProcess:
    """The real `invokeai-web` on `root` and `port`, logging to `log`; stop() sends SIGTERM and waits."""

    def __init__(self, executable: str, root: Path, port: int, log: Path, env: dict[str, str]) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        with log.open("ab") as log_file:
            self.process = subprocess.Popen(
                [executable, "--root", str(root), "--port", str(port)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def wait_up(self, headers: dict[str, str] | None = None, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"invokeai-web exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                httpx.get(f"{self.base}/api/v1/app/version", headers=headers, timeout=5)
                return
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError(f"invokeai-web did not answer within {timeout} s:\n{self.log.read_text()}")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Subscriber:
    """One client of a server's event stream, read on a thread: the status changes it received, in order, and the
    item and node of every event of `names`."""

    def __init__(self, base: str, names: tuple[str, ...] = ("queue_item_status_changed",)) -> None:
        self.statuses: list[tuple[int, str]] = []
        self.events: list[tuple[int, str, str | None]] = []
        self._names = names
        self._subscribed = threading.Event()
        self._client = httpx.Client(base_url=base, timeout=httpx.Timeout(10, read=None))
        threading.Thread(target=self._read, daemon=True).start()
        assert self._subscribed.wait(20), f"could not subscribe to {base}"

    def _read(self) -> None:
        query = "&".join(f"event={name}" for name in self._names)
        try:
            with connect_sse(self._client, "GET", f"{QUEUE}/events?{query}") as source:
                self._subscribed.set()
                for sse in source.iter_sse():
                    payload = json.loads(sse.data)
                    self.events.append((payload["item_id"], sse.event, payload.get("node_id")))
                    if sse.event == "queue_item_status_changed":
                        self.statuses.append((payload["item_id"], payload["status"]))
        except httpx.HTTPError:
            pass  # closed at the end of the test, or its server was killed

    def seen(self, status: str) -> Counter[int]:
        return Counter(item_id for item_id, got in list(self.statuses) if got == status)

    def nodes(self, item_id: int, name: str) -> list[str | None]:
        """The node ids of the item's events of `name`, in order."""
        return [node_id for got, event, node_id in list(self.events) if got == item_id and event == name]

    def close(self) -> None:
        self._client.close()
