"""The event stream's own work, on the app served by uvicorn in this process over a real socket: framing, headers,
keepalive comments, no event lost to the keepalive timer, and a client that goes away is unsubscribed."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from wait_support import wait_until

from invokeai.app.api.app_factory import create_app
from invokeai.app.api.routers import events as events_router
from invokeai.app.config import InvokeAIAppConfig
from invokeai.app.services.events import BatchEnqueuedEvent, EventBus

STREAM = "/api/v1/queue/default/events"


@dataclass
class Served:
    base: str
    app: FastAPI

    @property
    def bus(self) -> EventBus:
        bus: EventBus = self.app.state.events
        return bus


@pytest.fixture
def served(tmp_path: Path, free_port: int) -> Iterator[Served]:
    config = InvokeAIAppConfig.located({"use_memory_db": True}, tmp_path, None)
    app = create_app(config, run_processor=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield Served(f"http://127.0.0.1:{free_port}", app)
    server.should_exit = True
    thread.join(30)


def enqueued(number: int, queue_id: str = "default") -> BatchEnqueuedEvent:
    return BatchEnqueuedEvent(queue_id=queue_id, batch_id=f"b{number}", enqueued=number, requested=number, priority=0)


def test_events_are_framed_with_their_name_and_json_payload(served: Served) -> None:
    with httpx.Client(base_url=served.base, timeout=10) as client, client.stream("GET", STREAM) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        event = enqueued(3)
        served.bus.publish(enqueued(4, queue_id="another"))  # another queue's event does not come here
        served.bus.publish(event)
        lines = response.iter_lines()
        assert next(lines) == "event: batch_enqueued"
        data = next(lines)
        assert data.startswith("data: ")
        assert json.loads(data.removeprefix("data: ")) == event.model_dump(mode="json")
        assert next(lines) == ""


def test_idle_streams_get_keepalive_comments_and_no_event_is_lost_to_them(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Events published around the keepalive deadline: a wait that times out must not swallow one.
    monkeypatch.setattr(events_router, "KEEPALIVE_SECONDS", 0.02)
    count = 60
    rng = random.Random(0)

    def publish() -> None:
        for number in range(count):
            time.sleep(rng.uniform(0.0, 0.04))
            served.bus.publish(enqueued(number))

    with httpx.Client(base_url=served.base, timeout=10) as client, client.stream("GET", STREAM) as response:
        publisher = threading.Thread(target=publish)
        publisher.start()
        numbers, comments = [], 0
        for line in response.iter_lines():
            if line == ": ping":
                comments += 1
            elif line.startswith("data: "):
                numbers.append(json.loads(line.removeprefix("data: "))["enqueued"])
                if len(numbers) == count:
                    break
        publisher.join()
    assert numbers == list(range(count))
    assert comments > 0


def test_a_client_that_went_away_is_unsubscribed(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    # Starlette notices the disconnect at once; a server without that notice finds it at the next keepalive write.
    monkeypatch.setattr(events_router, "KEEPALIVE_SECONDS", 0.05)
    with httpx.Client(base_url=served.base, timeout=10) as client, client.stream("GET", STREAM) as response:
        assert response.status_code == 200
        assert served.bus.subscriber_count == 1
    wait_until(lambda: served.bus.subscriber_count == 0, what="the subscription to end")


def test_closing_the_bus_ends_the_stream(served: Served) -> None:
    with httpx.Client(base_url=served.base, timeout=10) as client, client.stream("GET", STREAM) as response:
        served.bus.publish(enqueued(1))
        served.bus.close()
        lines = list(response.iter_lines())  # returns: the server ended the response
    assert lines[0] == "event: batch_enqueued"
    assert served.bus.subscriber_count == 0


def test_a_stream_can_name_the_events_it_takes(served: Served) -> None:
    from invokeai.app.services.events import ModelInstallCancelledEvent
    from invokeai.app.services.model_install_jobs import LocalModelSource

    installed = ModelInstallCancelledEvent(id=1, source=LocalModelSource(path="/m"))
    params = {"event": ["model_install_cancelled", "queue_item_status_changed"]}
    with httpx.Client(base_url=served.base, timeout=10) as client, client.stream("GET", STREAM, params=params) as named:
        assert named.status_code == 200
        served.bus.publish(enqueued(1))  # not named: not sent
        served.bus.publish(installed)
        lines = named.iter_lines()
        assert [next(lines), next(lines)] == ["event: model_install_cancelled", f"data: {installed.model_dump_json()}"]


def test_an_unknown_event_name_is_refused_naming_the_parameter_and_the_names(served: Served) -> None:
    response = httpx.get(f"{served.base}{STREAM}", params={"event": ["batch_enqueued", "progress"]}, timeout=10)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["query", "event", 1]
    assert "'invocation_progress'" in error["msg"] and "'batch_enqueued'" in error["msg"]
    assert served.bus.subscriber_count == 0


class StreamReader:
    """One subscriber reading its stream on its own thread, as fast as it can; `ended`: the server closed it."""

    def __init__(self, base: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.ended = False
        self._client = httpx.Client(base_url=base, timeout=60)
        self._response = self._client.send(self._client.build_request("GET", STREAM), stream=True)
        assert self._response.status_code == 200  # headers in: subscribed
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        name = ""
        try:
            for line in self._response.iter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    self.events.append((name, json.loads(line.removeprefix("data: "))))
        except httpx.HTTPError:
            pass
        self.ended = True

    def saw(self, name: str, **fields: Any) -> bool:
        return any(n == name and all(data.get(k) == v for k, v in fields.items()) for n, data in list(self.events))

    def canceled_ids(self) -> list[int]:
        """Every item the stream says was canceled, whether one event per item or one for many."""
        ids = []
        for name, data in self.events:
            if name == "queue_item_status_changed" and data["status"] == "canceled":
                ids.append(data["item_id"])
            elif name == "queue_items_canceled":
                ids.extend(data["item_ids"])
        return ids

    def close(self) -> None:
        self._response.close()
        self._client.close()


@pytest.fixture
def readers(served: Served, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[StreamReader]]:
    # Closing a stream that another thread reads waits for the server's next write: make that soon.
    monkeypatch.setattr(events_router, "KEEPALIVE_SECONDS", 0.1)
    pair = [StreamReader(served.base), StreamReader(served.base)]
    yield pair
    for reader in pair:
        reader.close()


def _float_batch(runs: int) -> dict[str, Any]:
    return {"batch": {"graph": {"id": "g", "nodes": {"f": {"id": "f", "type": "float", "value": 1.5}}}, "runs": runs}}


def _after_marker(served: Served, readers: list[StreamReader]) -> None:
    """Enqueue a marker batch and wait until each stream has it or has ended: everything before it has arrived."""
    marker = httpx.post(f"{served.base}/api/v1/queue/default/enqueue_batch", json=_float_batch(1)).json()
    batch_id = marker["batch"]["batch_id"]
    wait_until(lambda: all(r.ended or r.saw("batch_enqueued", batch_id=batch_id) for r in readers), 30, "the marker")
    assert [r.ended for r in readers] == [False, False], "a healthy stream was ended"


def test_two_streams_survive_a_bulk_cancel_of_1500_items_and_see_every_one(
    served: Served, readers: list[StreamReader]
) -> None:
    queue = "/api/v1/queue/default"
    enqueued = httpx.post(f"{served.base}{queue}/enqueue_batch", json=_float_batch(1500), timeout=60).json()
    ids, batch_id = enqueued["item_ids"], enqueued["batch"]["batch_id"]
    answer = httpx.put(f"{served.base}{queue}/cancel_by_batch_ids", json={"batch_ids": [batch_id]}, timeout=60)
    assert answer.json() == {"canceled": 1500}
    _after_marker(served, readers)
    for reader in readers:
        assert reader.canceled_ids() == ids


@pytest.mark.parametrize("how", ["clear", "prune"])
def test_two_streams_survive_clearing_or_pruning_1500_items(
    served: Served, readers: list[StreamReader], how: str
) -> None:
    queue = "/api/v1/queue/default"
    enqueued = httpx.post(f"{served.base}{queue}/enqueue_batch", json=_float_batch(1500), timeout=60).json()
    if how == "prune":
        batch = {"batch_ids": [enqueued["batch"]["batch_id"]]}
        httpx.put(f"{served.base}{queue}/cancel_by_batch_ids", json=batch, timeout=60)
    assert httpx.put(f"{served.base}{queue}/{how}", timeout=60).json() == {"deleted": 1500}
    _after_marker(served, readers)
    for reader in readers:
        assert reader.saw(f"queue_{'cleared' if how == 'clear' else 'pruned'}", deleted=1500)
