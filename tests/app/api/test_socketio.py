"""InvokeAI's events over Socket.IO at /ws/socket.io, with python-socketio's own client against the app served by
uvicorn in this process: names and payloads (checked against InvokeAI 6.14.2's OpenAPI components), rooms, the
token, the bounds on a client, both transports, and events from a second server on the same PostgreSQL database."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import socketio
import uvicorn
from api_support import graph_json, node
from fastapi import FastAPI
from wait_support import wait_until

from invokeai.app.api import sockets as sockets_module
from invokeai.app.api.app_factory import create_app
from invokeai.app.api.sockets import SocketServer
from invokeai.app.config import InvokeAIAppConfig
from invokeai.app.services.events import EventBase, EventBus, InvocationProgressEvent, ModelInstallCancelledEvent
from invokeai.app.services.model_install_jobs import LocalModelSource

QUEUE = "/api/v1/queue/default"
PATH = "/ws/socket.io"
BLANK = graph_json(node("b", "blank_image", width=48, height=32))
TRANSPORTS = ["websocket", "polling"]
REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "reference" / "invokeai-6.14.2-openapi.json"


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    if not REFERENCE.is_file():
        pytest.skip(f"InvokeAI 6.14.2's OpenAPI document is not at {REFERENCE}")
    document: dict[str, Any] = json.loads(REFERENCE.read_text())
    return document


EVENT_SCHEMAS = {
    "QueueItemStatusChangedEvent": "QueueItemStatusChangedEvent",
    "BatchStatusCounts": "BatchStatus",
    "QueueStatusCounts": "SessionQueueStatus",
    "InvocationStartedEvent": "InvocationStartedEvent",
    "InvocationProgressEvent": "InvocationProgressEvent",
    "ProgressImage": "ProgressImage",
    "InvocationCompleteEvent": "InvocationCompleteEvent",
    "InvocationErrorEvent": "InvocationErrorEvent",
    "BatchEnqueuedEvent": "BatchEnqueuedEvent",
    "QueueClearedEvent": "QueueClearedEvent",
    "QueueItemsCanceledEvent": "QueueItemsCanceledEvent",
    "QueueItemsRetriedEvent": "QueueItemsRetriedEvent",
}


def lacking(reference: dict[str, Any], schema: str, payload: dict[str, Any]) -> list[str]:
    """The fields InvokeAI's component `schema` requires that `payload` lacks."""
    required = set(reference["components"]["schemas"][schema].get("required", []))
    return sorted(required - set(payload))


@dataclass
class Served:
    base: str
    app: FastAPI
    stop: Callable[[], None]

    @property
    def bus(self) -> EventBus:
        bus: EventBus = self.app.state.events
        return bus

    @property
    def sockets(self) -> SocketServer:
        sockets: SocketServer = self.app.state.sockets
        return sockets


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """serve(**settings): the app with these settings, served by uvicorn on a free port until the test ends."""
    stops: list[Callable[[], None]] = []

    def start(run_processor: bool = True, **settings: Any) -> Served:
        root = tmp_path / f"root{len(stops)}"
        config = InvokeAIAppConfig.located({"use_memory_db": True, **settings}, root, None)
        app = create_app(config, run_processor=run_processor)
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

        def stop() -> None:
            server.should_exit = True
            thread.join(30)
            assert not thread.is_alive(), "uvicorn did not stop"

        stops.append(stop)
        return Served(f"http://127.0.0.1:{port}", app, stop)

    yield start
    for stop in stops:
        stop()


class Client:
    """python-socketio's client, recording every event it gets (name, payload) in order."""

    def __init__(self, base: str, transport: str = "websocket", **connect: Any) -> None:
        self.events: list[tuple[str, Any]] = []
        self.disconnected = threading.Event()
        self._lock = threading.Lock()
        self.sio = socketio.Client(reconnection=False)
        self.sio.on("*", self._take)
        self.sio.on("disconnect", lambda *args: self.disconnected.set())
        self.sio.connect(base, socketio_path=PATH, transports=[transport], wait_timeout=10, **connect)

    def _take(self, name: str, data: Any = None) -> None:
        with self._lock:
            self.events.append((name, data))

    def of(self, name: str, **fields: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [
                data
                for got, data in self.events
                if got == name and all(isinstance(data, dict) and data.get(k) == v for k, v in fields.items())
            ]

    def names(self) -> list[str]:
        with self._lock:
            return [name for name, _ in self.events]

    def subscribe(self, queue_id: str = "default") -> None:
        # An acknowledged emit: the subscription has taken effect when it returns (the handler ran).
        self.sio.call("subscribe_queue", {"queue_id": queue_id}, timeout=10)

    def close(self) -> None:
        if self.sio.connected:
            self.sio.disconnect()


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(base: str, transport: str = "websocket", **connect: Any) -> Client:
        made.append(Client(base, transport, **connect))
        return made[-1]

    yield make
    for client in made:
        client.close()


def enqueue(base: str, graph: dict[str, Any], **headers: str) -> int:
    response = httpx.post(
        f"{base}{QUEUE}/enqueue_batch", json={"batch": {"graph": graph, "runs": 1}}, headers=headers, timeout=30
    )
    assert response.status_code in (200, 201), response.text
    item_id: int = response.json()["item_ids"][0]
    return item_id


def finished(client: Client, item_id: int) -> list[dict[str, Any]]:
    return [
        data
        for data in client.of("queue_item_status_changed", item_id=item_id)
        if data["status"] in ("completed", "failed", "canceled")
    ]


def test_the_documents_event_schemas_have_every_field_invokeai_requires(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    config = InvokeAIAppConfig.located({"use_memory_db": True}, tmp_path, None)
    ours = create_app(config).openapi()["components"]["schemas"]
    for name, theirs in EVENT_SCHEMAS.items():
        required = set(ours[name].get("required", []))
        assert lacking(reference, theirs, dict.fromkeys(required)) == [], name
        assert set(reference["components"]["schemas"][theirs]["properties"]) <= set(ours[name]["properties"]), name


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_subscribed_client_gets_the_queues_events_with_invokeais_fields(
    serve: Callable[..., Served], clients: Callable[..., Client], reference: dict[str, Any], transport: str
) -> None:
    served = serve()
    client = clients(served.base, transport)
    client.subscribe()
    item_id = enqueue(served.base, BLANK)
    wait_until(lambda: finished(client, item_id), what="the item's last status change")

    statuses = [data["status"] for data in client.of("queue_item_status_changed", item_id=item_id)]
    assert statuses == ["in_progress", "completed"]
    assert client.names() == [
        "batch_enqueued",
        "queue_item_status_changed",
        "invocation_started",
        "invocation_complete",
        "queue_item_status_changed",
    ]
    for name, schema in (
        ("queue_item_status_changed", "QueueItemStatusChangedEvent"),
        ("invocation_started", "InvocationStartedEvent"),
        ("invocation_complete", "InvocationCompleteEvent"),
        ("batch_enqueued", "BatchEnqueuedEvent"),
    ):
        for payload in client.of(name):
            assert lacking(reference, schema, payload) == [], (name, payload)
    for changed in client.of("queue_item_status_changed", item_id=item_id):
        assert lacking(reference, "BatchStatus", changed["batch_status"]) == []
        assert lacking(reference, "SessionQueueStatus", changed["queue_status"]) == []
        assert isinstance(changed["timestamp"], int) and changed["user_id"] == "system"
    completed = finished(client, item_id)[0]
    assert completed["batch_status"]["completed"] == 1 and completed["batch_status"]["total"] == 1
    assert completed["queue_status"]["completed"] == 1 and completed["queue_status"]["item_id"] is None
    in_progress = client.of("queue_item_status_changed", status="in_progress")[0]
    assert in_progress["queue_status"]["item_id"] == item_id and in_progress["queue_status"]["in_progress"] == 1

    [started] = client.of("invocation_started", item_id=item_id)
    [complete] = client.of("invocation_complete", item_id=item_id)
    for payload in (started, complete):
        # This server's node ids are the source ids; the invocation is the node as in the graph.
        assert payload["invocation_source_id"] == "b" == payload["node_id"]
        assert payload["invocation"]["type"] == "blank_image" and payload["invocation"]["width"] == 48
    assert complete["result"]["type"] == "image_output" and complete["result"]["image"]["image_name"]


def test_batch_status_counts_the_items_batch_and_queue_status_the_whole_queue(
    serve: Callable[..., Served], clients: Callable[..., Client]
) -> None:
    served = serve()
    client = clients(served.base)
    client.subscribe()
    response = httpx.post(
        f"{served.base}{QUEUE}/enqueue_batch", json={"batch": {"graph": BLANK, "runs": 2, "origin": "o"}}, timeout=30
    )
    assert response.status_code in (200, 201), response.text
    last = enqueue(served.base, BLANK)
    [completed] = wait_until(lambda: finished(client, last), what="the last item")
    assert completed["batch_status"]["total"] == completed["batch_status"]["completed"] == 1
    assert (
        completed["batch_status"]["origin"] is None and completed["batch_status"]["batch_id"] == completed["batch_id"]
    )
    assert completed["queue_status"]["total"] == completed["queue_status"]["completed"] == 3
    first = client.of("queue_item_status_changed", status="in_progress")[0]
    assert first["origin"] == first["batch_status"]["origin"] == "o"
    assert (first["batch_status"]["in_progress"], first["batch_status"]["pending"]) == (1, 1)
    queue = first["queue_status"]  # the second batch may or may not be enqueued yet
    assert queue["in_progress"] == 1 and queue["item_id"] == first["item_id"]
    assert queue["total"] == sum(
        queue[s] for s in ("pending", "in_progress", "waiting", "completed", "failed", "canceled")
    )


def test_both_transports_carry_the_same_payloads_as_the_event_stream(
    serve: Callable[..., Served], clients: Callable[..., Client]
) -> None:
    served = serve()
    over_websocket, over_polling = clients(served.base, "websocket"), clients(served.base, "polling")
    over_websocket.subscribe()
    over_polling.subscribe()
    with (
        httpx.Client(base_url=served.base, timeout=10) as http,
        http.stream("GET", f"{QUEUE}/events", params={"event": "invocation_complete"}) as stream,
    ):
        item_id = enqueue(served.base, BLANK)
        lines = stream.iter_lines()
        assert next(lines) == "event: invocation_complete"
        over_sse = json.loads(next(lines).removeprefix("data: "))
    wait_until(lambda: finished(over_websocket, item_id) and finished(over_polling, item_id), what="both")
    assert over_websocket.of("invocation_complete") == over_polling.of("invocation_complete") == [over_sse]


def test_progress_and_errors_carry_invokeais_fields(
    serve: Callable[..., Served],
    clients: Callable[..., Client],
    reference: dict[str, Any],
    scripted_integer_node: list[str],
) -> None:
    served = serve()
    client = clients(served.base)
    client.subscribe()
    stepped = enqueue(served.base, graph_json(node("n", "integer", value=3)))
    failing = enqueue(served.base, graph_json(node("n", "integer", value=-1)))
    wait_until(lambda: finished(client, stepped) and finished(client, failing), what="both items")

    progress = client.of("invocation_progress", item_id=stepped)
    assert [(p["step"], p["percentage"]) for p in progress] == [(1, 1 / 3), (2, 2 / 3), (3, 1.0)]
    for payload in progress:
        assert lacking(reference, "InvocationProgressEvent", payload) == []
        assert payload["message"] == "Denoising" and payload["device"] is None
    image = progress[0]["image"]
    assert lacking(reference, "ProgressImage", image) == []
    assert image["dataURL"].startswith("data:image/jpeg;base64,") and (image["width"], image["height"]) == (256, 128)
    assert progress[1]["image"] is None  # the scripted node previews its first step only

    [error] = client.of("invocation_error", item_id=failing)
    assert lacking(reference, "InvocationErrorEvent", error) == []
    assert error["error_type"] == "RuntimeError" and "on purpose" in error["error_message"]
    assert finished(client, failing)[0]["status"] == "failed"


def test_clearing_the_queue_and_bulk_changes_carry_invokeais_fields(
    serve: Callable[..., Served], clients: Callable[..., Client], reference: dict[str, Any]
) -> None:
    served = serve(run_processor=False)  # items stay pending, to be canceled and cleared
    client = clients(served.base)
    client.subscribe()
    enqueue(served.base, BLANK)
    [enqueued] = wait_until(lambda: client.of("batch_enqueued"), what="batch_enqueued")
    batch_id = enqueued["batch_id"]
    response = httpx.put(f"{served.base}{QUEUE}/cancel_by_batch_ids", json={"batch_ids": [batch_id]}, timeout=10)
    assert response.status_code == 200, response.text
    assert httpx.put(f"{served.base}{QUEUE}/clear", timeout=10).status_code == 200
    [canceled] = wait_until(lambda: client.of("queue_items_canceled"), what="queue_items_canceled")
    [cleared] = wait_until(lambda: client.of("queue_cleared"), what="queue_cleared")
    assert lacking(reference, "QueueItemsCanceledEvent", canceled) == []
    assert canceled["canceled_item_ids"] == canceled["item_ids"] and canceled["user_ids"] == ["system"]
    assert lacking(reference, "QueueClearedEvent", cleared) == []
    assert cleared["user_id"] is None


class QueueNoteEvent(EventBase):
    """An event that sockets.py has never heard of: it goes out under its name all the same."""

    event_name: ClassVar[str] = "queue_note_for_the_test"
    note: str


def test_only_subscribers_get_a_queues_events_and_every_client_gets_the_model_events(
    serve: Callable[..., Served], clients: Callable[..., Client]
) -> None:
    served = serve()
    subscribed, idle, elsewhere = clients(served.base), clients(served.base, "polling"), clients(served.base)
    subscribed.subscribe()
    elsewhere.subscribe("another")
    first = enqueue(served.base, BLANK)
    wait_until(lambda: finished(subscribed, first), what="the first item")
    served.bus.publish(QueueNoteEvent(queue_id="default", note="generic"))
    served.bus.publish(ModelInstallCancelledEvent(id=1, source=LocalModelSource(path="/m")))
    wait_until(lambda: all(c.of("model_install_cancelled") for c in (subscribed, idle, elsewhere)), what="model")
    [note] = wait_until(lambda: subscribed.of("queue_note_for_the_test"), what="the new event")
    assert (note["queue_id"], note["note"]) == ("default", "generic")
    assert idle.names() == elsewhere.names() == ["model_install_cancelled"]

    # After unsubscribe_queue, nothing more of the queue: a second subscriber sees the next item through.
    subscribed.sio.call("unsubscribe_queue", {"queue_id": "default"}, timeout=10)
    witness = clients(served.base)
    witness.subscribe()
    second = enqueue(served.base, BLANK)
    wait_until(lambda: finished(witness, second), what="the second item")
    assert not [name for name, data in subscribed.events if isinstance(data, dict) and data.get("item_id") == second]
    assert idle.names() == elsewhere.names() == ["model_install_cancelled"]


def test_nobody_subscribed_costs_no_preview_and_a_gone_client_leaves_no_trace(
    serve: Callable[..., Served], clients: Callable[..., Client]
) -> None:
    served = serve(run_processor=False)
    progress = InvocationProgressEvent.event_name
    connected = clients(served.base)
    assert not served.bus.wants_previews("default") and not served.bus.is_wanted(progress, "default")
    connected.subscribe()
    assert served.bus.wants_previews("default") and not served.bus.wants_previews("another")
    assert served.sockets.subscribers("default") == 1
    connected.close()
    wait_until(lambda: served.sockets.client_count == 0, what="the client to be forgotten")
    assert served.sockets.subscribers("default") == 0
    assert not served.bus.wants_previews("default") and not served.bus.is_wanted(progress, "default")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_with_api_token_the_handshake_needs_it(
    serve: Callable[..., Served], clients: Callable[..., Client], transport: str
) -> None:
    served = serve(api_token="s3cret-token")
    for attempt in ({}, {"auth": {"token": "wrong"}}, {"headers": {"Authorization": "Bearer wrong"}}, {"auth": 5}):
        refusals: list[Any] = []
        sio = socketio.Client(reconnection=False)
        sio.on("connect_error", refusals.append)
        with pytest.raises(socketio.exceptions.ConnectionError):
            sio.connect(served.base, socketio_path=PATH, transports=[transport], wait_timeout=10, **attempt)
        assert "api_token" in str(refusals), (attempt, refusals)
    by_auth = clients(served.base, transport, auth={"token": "s3cret-token"})
    by_header = clients(served.base, transport, headers={"Authorization": "Bearer s3cret-token"})
    by_auth.subscribe()
    by_header.subscribe()
    item_id = enqueue(served.base, BLANK, Authorization="Bearer s3cret-token")
    wait_until(lambda: finished(by_auth, item_id) and finished(by_header, item_id), what="the item on both")
    assert served.sockets.client_count == 2


def test_the_token_middleware_and_the_web_ui_leave_the_socket_path_alone(serve: Callable[..., Served]) -> None:
    served = serve(api_token="s3cret-token")
    # engine.io's open packet, neither a 401 (the middleware guards /api/) nor the web UI's page (its fallback).
    response = httpx.get(f"{served.base}{PATH}/", params={"EIO": "4", "transport": "polling"}, timeout=10)
    assert response.status_code == 200 and response.text.startswith('0{"sid":'), response.text[:200]
    assert httpx.get(f"{served.base}/api/v1/app/version", timeout=10).status_code == 401


def test_a_refused_handshake_is_closed_by_the_server(serve: Callable[..., Served]) -> None:
    """A client that ignores the refusal does not keep its engine.io session (raw polling, as a script could)."""
    served = serve(api_token="s3cret-token")
    with httpx.Client(base_url=f"{served.base}{PATH}/", timeout=10) as http:
        sid = json.loads(http.get("", params={"EIO": "4", "transport": "polling"}).text[1:])["sid"]
        params = {"EIO": "4", "transport": "polling", "sid": sid}
        assert http.post("", params=params, content=b'40{"token":"wrong"}').status_code == 200
        refusal = http.get("", params=params).text
        assert refusal.startswith("44") and "api_token" in refusal
        wait_until(lambda: http.get("", params=params).status_code == 400, what="the session to be closed")


def test_the_server_stops_at_once_after_a_polling_client_left(
    serve: Callable[..., Served], clients: Callable[..., Client]
) -> None:
    served = serve()
    gone = clients(served.base, "polling")
    gone.subscribe()
    item_id = enqueue(served.base, BLANK)
    wait_until(lambda: finished(gone, item_id), what="the item")
    begun = time.monotonic()
    gone.close()  # its last long poll is answered at once, not after engine.io's ping timeout (45 s)
    served.stop()
    assert time.monotonic() - begun < 10


def test_the_shutdown_signal_disconnects_every_client(
    serve: Callable[..., Served], clients: Callable[..., Client]
) -> None:
    served = serve(run_processor=False)
    connected = [clients(served.base, transport) for transport in TRANSPORTS]
    for client in connected:
        client.subscribe()
    begun = time.monotonic()
    served.bus.close()  # what the shutdown signal does first (server.serve's on_exit)
    for client in connected:
        assert client.disconnected.wait(10)
    served.stop()
    assert time.monotonic() - begun < 10


def test_after_a_gap_in_the_events_every_client_is_disconnected_and_new_ones_get_events(
    serve: Callable[..., Served], clients: Callable[..., Client]
) -> None:
    served = serve(run_processor=False)
    before = clients(served.base)
    before.subscribe()
    served.bus.end_streams()  # what the relay does after its database connection came back
    assert before.disconnected.wait(10)
    after = clients(served.base)
    after.subscribe()
    served.bus.publish(ModelInstallCancelledEvent(id=1, source=LocalModelSource(path="/m")))
    wait_until(lambda: after.of("model_install_cancelled"), what="an event after the gap")


def test_a_client_with_too_many_packets_waiting_is_cut_off(
    serve: Callable[..., Served], clients: Callable[..., Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    served = serve(run_processor=False)
    client = clients(served.base)
    client.subscribe()
    # A bound of -1 packets, checked at every event: the one reader here is "behind" at once.
    monkeypatch.setattr(sockets_module, "MAX_BACKLOG", -1)
    monkeypatch.setattr(sockets_module, "BACKLOG_CHECK_S", 0.0)
    served.bus.publish(ModelInstallCancelledEvent(id=1, source=LocalModelSource(path="/m")))
    assert client.disconnected.wait(10)
    wait_until(lambda: served.sockets.client_count == 0, what="the client to be forgotten")


def test_a_client_subscribing_to_too_many_queues_is_cut_off(
    serve: Callable[..., Served], clients: Callable[..., Client]
) -> None:
    served = serve(run_processor=False)
    client = clients(served.base)
    for number in range(sockets_module.MAX_QUEUES):
        client.subscribe(f"queue-{number}")
    assert served.sockets.subscribers("queue-15") == 1
    client.sio.emit("subscribe_queue", {"queue_id": "one-too-many"})
    assert client.disconnected.wait(10)
    [error] = client.of("socket_error")
    assert error["event"] == "subscribe_queue" and "at most 16 queues" in error["message"]
    wait_until(lambda: served.sockets.client_count == 0, what="the client to be forgotten")
    assert served.sockets.subscribers("queue-0") == 0 and not served.bus.is_wanted("invocation_progress", "queue-0")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_client_flooding_messages_is_cut_off(
    serve: Callable[..., Served], clients: Callable[..., Client], transport: str
) -> None:
    served = serve(run_processor=False)
    calm, flooding = clients(served.base), clients(served.base, transport)
    # In runs of ten, a few hundred a second: over polling, engine.io itself refuses a POST of more packets than
    # its payload limit (the client then loses them), so a longer run would not reach the server's count.
    for number in range(sockets_module.MESSAGE_BURST * 3):
        if not flooding.sio.connected:
            break
        try:
            flooding.sio.emit("anything", {"n": number})
        except socketio.exceptions.BadNamespaceError:
            break
        if number % 10 == 9:
            time.sleep(0.02)
    assert flooding.disconnected.wait(10)
    assert "more than 60 messages" in flooding.of("socket_error")[0]["message"]
    # Another client is not affected.
    assert calm.sio.connected
    calm.subscribe()
    wait_until(lambda: served.sockets.client_count == 1, what="the flooding client to be forgotten")


def test_bad_subscriptions_are_refused_with_an_error_and_change_nothing(
    serve: Callable[..., Served], clients: Callable[..., Client]
) -> None:
    served = serve(run_processor=False)
    client = clients(served.base)
    for bad in ({"queue_id": "x" * 65}, {"queue_id": "a/b"}, {"queue_id": 5}, ["default"], "default", {}):
        client.sio.call("subscribe_queue", bad, timeout=10)
    client.sio.call("subscribe_queue", timeout=10)
    client.sio.call("subscribe_bulk_download", {"bulk_download_id": "default"}, timeout=10)  # InvokeAI's UI sends it
    client.sio.call("subscribe_bulk_download", {"bulk_download_id": 7}, timeout=10)
    errors = client.of("socket_error")
    assert [e["event"] for e in errors] == ["subscribe_queue"] * 7 + ["subscribe_bulk_download"]
    assert "queue_id" in errors[0]["message"] and "A-Za-z0-9" in errors[0]["message"]
    assert client.sio.connected and served.sockets.subscribers("default") == 0
    assert not served.bus.is_wanted("invocation_progress", "default")


def test_an_oversized_message_ends_the_connection(serve: Callable[..., Served], clients: Callable[..., Client]) -> None:
    served = serve(run_processor=False)
    client = clients(served.base)
    client.sio.emit("subscribe_queue", {"queue_id": "x" * (sockets_module.MAX_MESSAGE_BYTES + 10)})
    assert client.disconnected.wait(10)
    wait_until(lambda: served.sockets.client_count == 0, what="the client to be forgotten")


def test_events_of_a_second_server_on_the_same_postgresql_reach_the_socket(
    serve: Callable[..., Served], clients: Callable[..., Client], postgres_url: str
) -> None:
    runs_items = serve(use_memory_db=False, database_url=postgres_url)
    watched = serve(use_memory_db=False, database_url=postgres_url, run_processor=False)
    client = clients(watched.base)
    client.subscribe()
    item_id = enqueue(runs_items.base, BLANK)
    [completed] = wait_until(lambda: finished(client, item_id), timeout=30, what="the other server's item")
    assert completed["status"] == "completed" and completed["worker"]
    assert [data["status"] for data in client.of("queue_item_status_changed", item_id=item_id)] == [
        "in_progress",
        "completed",
    ]
    assert client.of("invocation_complete", item_id=item_id)[0]["invocation_source_id"] == "b"
