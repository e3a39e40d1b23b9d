"""GET /api/v1/app/devices with generation_devices: [cpu, cpu]: both workers, which is busy with which item, and
the models each sees in the shared cache; the queue status and the processor name every running item."""

from __future__ import annotations

import os
import socket

from api_support import MakeClient, enqueue, graph_json, node, wait_finished
from wait_support import wait_until

QUEUE = "/api/v1/queue/default"


def test_devices_lists_the_workers_and_the_item_each_runs(
    make_client: MakeClient, scripted_integer_node: list[str]
) -> None:
    client = make_client(generation_devices=["cpu", "cpu"])
    answer = client.get("/api/v1/app/devices").json()
    assert answer["server"] == {"host": socket.gethostname(), "pid": os.getpid()}
    assert [(w["name"], w["device"], w["busy"], w["item_id"]) for w in answer["workers"]] == [
        ("cpu#0", "cpu", False, None),
        ("cpu#1", "cpu", False, None),
    ]
    assert all(w["cached_models"] == [] and w["items_completed"] == 0 for w in answer["workers"])
    [item_id] = enqueue(client, graph_json(node("n", "integer", value=100_000))).json()["item_ids"]

    def busy() -> list[dict] | None:
        workers = client.get("/api/v1/app/devices").json()["workers"]
        return [w for w in workers if w["busy"]] or None

    [worker] = wait_until(busy, 10, "a worker to take the item")
    assert (worker["item_id"], worker["queue_id"]) == (item_id, "default")
    status = client.get(f"{QUEUE}/status").json()
    assert status["queue"]["item_ids"] == [item_id] and status["queue"]["item_id"] == item_id
    assert status["processor"]["running_item_ids"] == [item_id] and status["processor"]["workers"] == 2
    item = client.get(f"{QUEUE}/i/{item_id}").json()
    assert item["worker"] == f"{socket.gethostname()}:{os.getpid()}/{worker['name']}"
    client.put(f"{QUEUE}/i/{item_id}/cancel")
    assert wait_finished(client, item_id)["status"] == "canceled"
    wait_until(lambda: busy() is None, 10, "the worker to be free")


def test_the_devices_schema_is_in_openapi(client) -> None:  # type: ignore[no-untyped-def]
    document = client.get("/openapi.json").json()
    assert "/api/v1/app/devices" in document["paths"]
    worker = document["components"]["schemas"]["WorkerInfo"]["properties"]
    assert {"name", "device", "busy", "item_id", "queue_id", "items_completed", "cached_models"} <= set(worker)
