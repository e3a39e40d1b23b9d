"""Three real `invokeai-web` processes on one PostgreSQL database, each with its own root, sharing outputs_dir and
models_dir (docs/scale.md): every item runs once whichever server took it, every subscriber sees every status event,
a killed server's item is recovered, and an image made on one server is served by the others."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import FINISHED, SLOW_GRAPH, ServerProcess, Subscriber, graph_json, node

QUEUE = "/api/v1/queue/default"
LEASE_S = 3
TRIVIAL = graph_json(node("n", "integer", value=1))
SD_BODY = json.loads((Path(__file__).resolve().parents[3] / "docs" / "examples" / "sd_text_to_image.json").read_text())


@pytest.fixture(scope="module")
def servers(postgres_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    """A, B and C on one new database; A starts first and installs the demo models into the shared models_dir."""
    import uuid

    import psycopg

    name = f"cluster_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    shared = tmp_path_factory.mktemp("shared")
    settings = (
        f"database_url: {postgres_server.database_url(name)}\noutputs_dir: {shared / 'outputs'}\n"
        f"models_dir: {shared / 'models'}\nqueue_lease_seconds: {LEASE_S}\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.upper().startswith("INVOKEAI_")}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", INVOKEAI_DEVICE="cpu")
    started: list[ServerProcess] = []

    def start(label: str) -> ServerProcess:
        root = tmp_path_factory.mktemp(f"root-{label}")
        (root / "invokeai.yaml").write_text(settings)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        server = ServerProcess(
            str(Path(sys.executable).with_name("invokeai-web")), root, port, root / "server.log", env
        )
        started.append(server)
        return server

    try:
        a = start("a")
        a.wait_up(timeout=180)
        b, c = start("b"), start("c")
        b.wait_up(timeout=120)
        c.wait_up(timeout=120)
        yield [a, b, c]
    finally:
        for server in started:
            server.kill()
        with psycopg.connect(postgres_server.url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    for server in started:
        log = server.log.read_text()
        assert "Traceback" not in log, log[-3000:]


def all_items(base: str) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    offset = 0
    while True:
        page = httpx.get(f"{base}{QUEUE}/list", params={"offset": offset, "limit": 500}, timeout=30).json()
        found.update({item["item_id"]: item for item in page["items"]})
        if len(page["items"]) < 500:
            return found
        offset += 500


def items_by_id(base: str, ids: set[int]) -> dict[int, dict[str, Any]]:
    return {item_id: item for item_id, item in all_items(base).items() if item_id in ids}


def wait_all_finished(base: str, ids: set[int], timeout: float) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = items_by_id(base, ids)
        if len(found) == len(ids) and all(item["status"] in FINISHED for item in found.values()):
            return found
        assert time.monotonic() < deadline, Counter(item["status"] for item in found.values())
        time.sleep(0.2)


def server_of(item: dict[str, Any], servers: list[ServerProcess]) -> ServerProcess:
    """The server whose process ran the item: its `worker` is `<host>:<pid>/<worker name>`."""
    pid = int(item["worker"].split("/", 1)[0].rsplit(":", 1)[1])
    [server] = [server for server in servers if server.process.pid == pid]
    return server


def test_300_items_through_three_servers_each_run_once_and_every_subscriber_sees_every_event(
    servers: list[ServerProcess],
) -> None:
    subscribers = [Subscriber(server.base) for server in servers]
    try:
        ids: list[int] = []
        for n in range(30):  # batches of 10, round robin over A, B and C
            response = httpx.post(
                f"{servers[n % 3].base}{QUEUE}/enqueue_batch", json={"batch": {"graph": TRIVIAL, "runs": 10}}
            )
            assert response.status_code == 200, response.text
            ids += response.json()["item_ids"]
        wanted = set(ids)
        assert len(wanted) == 300
        items = wait_all_finished(servers[1].base, wanted, 120)
        assert Counter(item["status"] for item in items.values()) == {"completed": 300}
        ran_on = Counter(server_of(item, servers).base for item in items.values())
        assert len(ran_on) >= 2, ran_on  # the work spread over the servers

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(set(s.seen("completed")) >= wanted for s in subscribers):
            time.sleep(0.1)
        for server, subscriber in zip(servers, subscribers, strict=True):
            started, completed = subscriber.seen("in_progress"), subscriber.seen("completed")
            # Exactly once each: a relayed event is never delivered twice, and no item ran twice.
            assert {started[i] for i in wanted} == {1}, server.base
            assert {completed[i] for i in wanted} == {1}, server.base
        for server in servers:
            counts = httpx.get(f"{server.base}{QUEUE}/status").json()["queue"]
            assert counts["completed"] >= 300
    finally:
        for subscriber in subscribers:
            subscriber.close()


def test_a_demo_sd_item_enqueued_on_one_server_runs_on_another_and_a_third_serves_its_image(
    servers: list[ServerProcess],
) -> None:
    a = servers[0]
    # A busy with an item of its own (enqueued on A, A's worker hears of it first), so another server takes the SD.
    for _ in range(3):
        busy = httpx.post(f"{a.base}{QUEUE}/enqueue_batch", json={"batch": {"graph": SLOW_GRAPH}}).json()["item_ids"][0]
        deadline = time.monotonic() + 30
        while (item := httpx.get(f"{a.base}{QUEUE}/i/{busy}").json())["status"] == "pending":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        if server_of(item, servers) is a:
            break
        wait_all_finished(a.base, {busy}, 60)
    else:
        pytest.fail("A never took its own item: the test cannot keep A busy")
    sd = httpx.post(f"{a.base}{QUEUE}/enqueue_batch", json=SD_BODY).json()["item_ids"][0]
    done = wait_all_finished(a.base, {sd, busy}, 180)[sd]
    assert done["status"] == "completed", done
    runner = server_of(done, servers)
    assert runner is not a
    [third] = [server for server in servers if server not in (a, runner)]
    [image_name] = [value["image"]["image_name"] for value in done["session"]["results"].values() if "image" in value]
    response = httpx.get(f"{third.base}/api/v1/images/i/{image_name}/full")
    assert response.status_code == 200
    assert response.content.startswith(b"\x89PNG\r\n\x1a\n")
    listed = {image["image_name"] for image in httpx.get(f"{third.base}/api/v1/images/?limit=500").json()["items"]}
    assert image_name in listed


def test_a_killed_servers_item_is_canceled_with_the_reason_and_the_others_go_on(
    servers: list[ServerProcess],
) -> None:
    a, b = servers[:2]
    completed_before = {i for i, item in all_items(a.base).items() if item["status"] == "completed"}
    response = httpx.post(f"{b.base}{QUEUE}/enqueue_batch", json={"batch": {"graph": SLOW_GRAPH, "runs": 3}})
    ids = response.json()["item_ids"]
    deadline = time.monotonic() + 30
    while not (running := [i for i in items_by_id(a.base, set(ids)).values() if i["status"] == "in_progress"]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    victim_item = running[0]
    victim = server_of(victim_item, servers)
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait(10)
    killed_at = time.monotonic()
    survivor = next(server for server in servers if server is not victim)
    deadline = killed_at + LEASE_S + 30
    while (item := httpx.get(f"{survivor.base}{QUEUE}/i/{victim_item['item_id']}").json())["status"] == "in_progress":
        assert time.monotonic() < deadline, "the killed server's item was not recovered"
        time.sleep(0.2)
    assert item["status"] == "canceled"
    assert "stopped" in item["cancel_reason"]
    rest = set(ids) - {victim_item["item_id"]}
    others = wait_all_finished(survivor.base, rest, 120)
    # The other items run on the live servers (one may have been taken by the victim too, and recovered).
    assert all(i["status"] in ("completed", "canceled") for i in others.values())
    assert any(i["status"] == "completed" for i in others.values())
    after = items_by_id(survivor.base, completed_before)
    assert all(after[i]["status"] == "completed" for i in completed_before)
    servers.remove(victim)
