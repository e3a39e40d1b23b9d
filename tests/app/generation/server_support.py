"""What the tests against a real server share: the example graphs, enqueueing one and waiting for it with its events,
reading an item, its image and the model records back, comparing images."""

from __future__ import annotations

import io
import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from httpx_sse import connect_sse
from PIL import Image

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "docs" / "examples"
QUEUE = "/api/v1/queue/default"
FINISHED = ("completed", "failed", "canceled")


def example(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((EXAMPLES_DIR / f"{name}.json").read_text(encoding="utf-8"))
    return body


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def enqueue(client: httpx.Client, body: dict[str, Any]) -> int:
    response = client.post(f"{QUEUE}/enqueue_batch", json=body)
    assert response.status_code == 200, response.text
    [item_id] = response.json()["item_ids"]
    return int(item_id)


def item_of(client: httpx.Client, item_id: int) -> dict[str, Any]:
    item: dict[str, Any] = client.get(f"{QUEUE}/i/{item_id}").json()
    return item


def run(client: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """Enqueue one batch and wait for its item: (the completed item, its events in order)."""
    events: list[tuple[str, dict[str, Any]]] = []
    with connect_sse(client, "GET", f"{QUEUE}/events") as source:
        item_id = enqueue(client, body)
        for sse in source.iter_sse():
            payload = json.loads(sse.data)
            if payload.get("item_id") == item_id:
                events.append((sse.event, payload))
                if sse.event == "queue_item_status_changed" and payload["status"] in FINISHED:
                    break
    item = item_of(client, item_id)
    assert item["status"] == "completed", (item.get("error_type"), item.get("error_message"))
    return item, events


def image_of(client: httpx.Client, item: dict[str, Any], node: str = "decode") -> Image.Image:
    """The RGB image the item's `node` made, as the server serves it (a PNG)."""
    name = item["session"]["results"][node]["image"]["image_name"]
    with Image.open(io.BytesIO(client.get(f"/api/v1/images/i/{name}/full").content)) as png:
        assert png.format == "PNG"
        return png.convert("RGB")


def install_model(client: httpx.Client, source: Path, name: str, timeout: float = 120) -> dict[str, Any]:
    """Install a model as InvokeAI's clients do (POST install?source=, then follow the job): its record."""
    response = client.post("/api/v2/models/install", params={"source": str(source)}, json={"name": name})
    assert response.status_code == 201, response.text
    deadline = time.monotonic() + timeout
    while (job := client.get(f"/api/v2/models/install/{response.json()['id']}").json())["status"] not in (
        "completed",
        "error",
        "cancelled",
    ):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    assert job["status"] == "completed", job
    record: dict[str, Any] = job["config_out"]
    return record


def models(client: httpx.Client) -> dict[str, dict[str, Any]]:
    """The installed model records by name."""
    return {m["name"]: m for m in client.get("/api/v2/models/").json()["models"]}


def max_diff(a: Image.Image, b: Image.Image) -> int:
    """The largest difference of any pixel channel, in 1/255 steps."""
    assert a.size == b.size
    return int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())


def cancel_mid_denoise(
    client: httpx.Client, body: dict[str, Any], after_steps: int = 3, steps_field: str = "steps"
) -> tuple[dict[str, Any], int]:
    """Run `body` with its denoise node set to 1000 steps (its input `steps_field`), cancel the item once
    `after_steps` steps were reported, and wait for it to end: (the item, the steps reported)."""
    body = json.loads(json.dumps(body))
    body["batch"]["graph"]["nodes"]["denoise"][steps_field] = 1000
    with connect_sse(client, "GET", f"{QUEUE}/events") as source:
        item_id = enqueue(client, body)
        steps_seen = 0
        for sse in source.iter_sse():
            payload = json.loads(sse.data)
            if sse.event == "invocation_progress" and payload["item_id"] == item_id:
                steps_seen += 1
                if steps_seen == after_steps:
                    assert client.put(f"{QUEUE}/i/{item_id}/cancel").json()["status"] == "canceled"
            if sse.event == "queue_item_status_changed" and payload["item_id"] == item_id:
                if payload["status"] in FINISHED:
                    break
    return item_of(client, item_id), steps_seen
