"""What the tests against a real server share: the example graphs, enqueueing one, reading an item back."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx

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
    assert response.status_code == 201, response.text
    [item_id] = response.json()["item_ids"]
    return int(item_id)


def item_of(client: httpx.Client, item_id: int) -> dict[str, Any]:
    item: dict[str, Any] = client.get(f"{QUEUE}/i/{item_id}").json()
    return item
