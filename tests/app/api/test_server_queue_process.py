"""The real `invokeai-web` in a subprocess, with a real event-stream client over a real socket."""

from __future__ import annotations

import io
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import FINISHED, IMAGE_GRAPH, SLOW_GRAPH, ServerProcess, graph_json, node
from httpx_sse import ServerSentEvent, connect_sse
from PIL import Image

QUEUE = "/api/v1/queue/default"
TOKEN = "process-test-token"


@pytest.fixture
def start(
    tmp_path: Path, invokeai_web: str, free_port: int, child_env: Callable[..., dict[str, str]]
) -> Iterator[Callable[..., ServerProcess]]:
    """start(**env): invokeai-web on tmp_path/root (the same root each time), up and answering."""
    started: list[ServerProcess] = []

    def run(headers: dict[str, str] | None = None, **env: str) -> ServerProcess:
        server = ServerProcess(invokeai_web, tmp_path / "root", free_port, tmp_path / "server.log", child_env(**env))
        started.append(server)
        server.wait_up(headers)
        return server

    yield run
    for server in started:
        server.kill()


def events_until_finished(stream: Iterator[ServerSentEvent], item_ids: set[int]) -> list[tuple[str, dict[str, Any]]]:
    """Read the stream until every item in item_ids has finished."""
    received: list[tuple[str, dict[str, Any]]] = []
    waiting = set(item_ids)
    for sse in stream:
        payload = json.loads(sse.data)
        received.append((sse.event, payload))
        if sse.event == "queue_item_status_changed" and payload["status"] in FINISHED:
            waiting.discard(payload["item_id"])
            if not waiting:
                break
    return received


def wait_for_event(stream: Iterator[ServerSentEvent], name: str, **fields: Any) -> dict[str, Any]:
    for sse in stream:
        payload: dict[str, Any] = json.loads(sse.data)
        if sse.event == name and all(payload.get(key) == value for key, value in fields.items()):
            return payload
    raise AssertionError(f"the stream ended before {name} {fields}")


def enqueue(client: httpx.Client, graph: dict[str, Any], runs: int = 1) -> list[int]:
    response = client.post(f"{QUEUE}/enqueue_batch", json={"batch": {"graph": graph, "runs": runs}})
    assert response.status_code == 200, response.text
    item_ids: list[int] = response.json()["item_ids"]
    return item_ids


def test_enqueue_events_in_order_completed_and_image_fetched_with_a_token(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    server = start(auth, INVOKEAI_API_TOKEN=TOKEN, INVOKEAI_NO_SUCH_SETTING="ignored")
    assert httpx.get(f"{server.base}{QUEUE}/events", timeout=10).status_code == 401
    assert httpx.get(f"{server.base}/api/v1/app/version", timeout=10).status_code == 401

    with httpx.Client(base_url=server.base, headers=auth, timeout=30) as client:
        with connect_sse(client, "GET", f"{QUEUE}/events") as source:
            assert source.response.headers["content-type"].startswith("text/event-stream")
            [item_id] = enqueue(client, IMAGE_GRAPH)
            received = events_until_finished(source.iter_sse(), {item_id})

        assert [(name, payload.get("node_id") or payload.get("status")) for name, payload in received] == [
            ("batch_enqueued", None),
            ("queue_item_status_changed", "in_progress"),
            ("invocation_started", "blank"),
            ("invocation_complete", "blank"),
            ("invocation_started", "resize"),
            ("invocation_complete", "resize"),
            ("queue_item_status_changed", "completed"),
        ]
        result = received[-2][1]["result"]
        assert (result["type"], result["width"], result["height"]) == ("image_output", 24, 16)
        assert client.get(f"{QUEUE}/i/{item_id}").json()["status"] == "completed"
        full = client.get(f"/api/v1/images/i/{result['image']['image_name']}/full")
        assert full.status_code == 200
        with Image.open(io.BytesIO(full.content)) as image:
            assert (image.format, image.size) == ("PNG", (24, 16))
        attention = client.get("/api/v1/app/attention").json()
        assert attention["installed"] is True and attention["setting"] == "auto"
        assert "api_token" not in client.get("/api/v1/app/config").json()["config"]

        # An open event stream does not hold up the shutdown.
        with connect_sse(client, "GET", f"{QUEUE}/events") as source:
            started = time.monotonic()
            assert server.stop() == 0
            assert list(source.iter_sse()) == []
            assert time.monotonic() - started < 10
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log
    assert TOKEN not in log


def test_failure_cancel_kill_restart_and_sigterm_mid_item(start: Callable[..., ServerProcess]) -> None:
    server = start()
    with httpx.Client(base_url=server.base, timeout=30) as client:
        with connect_sse(client, "GET", f"{QUEUE}/events") as source:
            stream = source.iter_sse()
            # A node that raises fails its item; the server goes on.
            missing = {"image_name": "0" * 32 + ".png"}
            [failed_id] = enqueue(client, graph_json(node("r", "image_resize", image=missing)))
            [done_id] = enqueue(client, IMAGE_GRAPH)
            received = events_until_finished(stream, {failed_id, done_id})
            error = next(p for name, p in received if name == "invocation_error")
            assert (error["item_id"], error["node_id"], error["error_type"]) == (failed_id, "r", "ImageNotFoundError")
            failed = client.get(f"{QUEUE}/i/{failed_id}").json()
            assert (failed["status"], failed["error_type"]) == ("failed", "ImageNotFoundError")
            done = client.get(f"{QUEUE}/i/{done_id}").json()
            assert done["status"] == "completed"
            image_name = done["session"]["results"]["resize"]["image"]["image_name"]

            # A cancel takes effect at the next node.
            [canceled_id] = enqueue(client, SLOW_GRAPH)
            wait_for_event(stream, "invocation_started", item_id=canceled_id, node_id="blank")
            assert client.put(f"{QUEUE}/i/{canceled_id}/cancel").json()["status"] == "canceled"
            while client.get(f"{QUEUE}/status").json()["processor"]["is_processing"]:
                time.sleep(0.05)
            canceled = client.get(f"{QUEUE}/i/{canceled_id}").json()
            assert canceled["status"] == "canceled"
            assert "big3" not in canceled["session"]["results"]

            # The process dies while an item runs.
            [killed_id] = enqueue(client, SLOW_GRAPH)
            wait_for_event(stream, "invocation_started", item_id=killed_id)
        server.process.kill()
        server.process.wait()

    server = start()
    with httpx.Client(base_url=server.base, timeout=30) as client:
        killed = client.get(f"{QUEUE}/i/{killed_id}").json()
        assert (killed["status"], killed["cancel_reason"]) == (
            "canceled",
            "the server stopped while this item was running",
        )
        assert client.get(f"{QUEUE}/i/{done_id}").json()["status"] == "completed"
        assert client.get(f"/api/v1/images/i/{image_name}/full").status_code == 200

        # SIGTERM while an item runs: a prompt, clean exit, and the item canceled with the reason.
        with connect_sse(client, "GET", f"{QUEUE}/events") as source:
            [stopped_id] = enqueue(client, SLOW_GRAPH)
            wait_for_event(source.iter_sse(), "invocation_started", item_id=stopped_id)
            began = time.monotonic()
            assert server.stop(signal.SIGTERM) == 0
            assert time.monotonic() - began < 10
    assert "Traceback" not in server.log.read_text()

    server = start()
    stopped = httpx.get(f"{server.base}{QUEUE}/i/{stopped_id}", timeout=10).json()
    assert (stopped["status"], stopped["cancel_reason"]) == ("canceled", "the server was shutting down")
    assert server.stop() == 0
