"""Faults of real `invokeai-web` processes sharing one PostgreSQL database and outputs_dir, with a short lease:

- one stopped (SIGSTOP) past its lease while its item writes its PNG, then resumed (SIGCONT), with and without
  requeue_interrupted;
- one killed (SIGKILL) right after its item completed.

After each: every item ends once with a true reason, none stays in_progress, the stopped server writes nothing after
its item was taken from it (no image record, no file), every surviving server's event stream gets each terminal
event once, and every image file has its record. Model-less graphs, no demo models: each test takes seconds."""

from __future__ import annotations

import io
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from api_support import FINISHED, QUEUE, ServerProcess, Subscriber, edge, graph_json, node
from PIL import Image
from wait_support import wait_until

from invokeai.app.services.images import TEMPORARY_PREFIX
from invokeai.app.services.session_queue import LEASE_EXPIRED_REASON

LEASE_S = 3  # the shortest the setting allows
TERMINAL = ("completed", "failed", "canceled")
# The image written by the item of the SIGSTOP tests: 2048x2048 noise takes PNG's deflate most of a second on a
# laptop core (a solid colour a tenth of that), so the stop lands inside the write with a wide margin.
NOISE_SIDE = 2048
SMALL_IMAGE_GRAPH = graph_json(
    node("blank", "blank_image", width=48, height=32, color="#ff0000"),
    node("resize", "image_resize", width=24, height=16),
    edges=[edge("blank", "image", "resize", "image")],
)


class Cluster:
    """Two servers on one new database, sharing outputs_dir: `cancels` recovers a stopped server's item by canceling
    it, `requeues` (requeue_interrupted) by putting it back to run again. `url`: the database, read by the test."""

    def __init__(self, url: str, outputs: Path, cancels: ServerProcess, requeues: ServerProcess) -> None:
        self.url = url
        self.outputs = outputs
        self.cancels = cancels
        self.requeues = requeues
        self.servers = [cancels, requeues]

    def by_pid(self, pid: int) -> ServerProcess:
        [server] = [server for server in self.servers if server.process.pid == pid]
        return server

    def other(self, server: ServerProcess) -> ServerProcess:
        [other] = [candidate for candidate in self.servers if candidate is not server]
        return other

    def row(self, item_id: int) -> dict[str, Any]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            found = conn.execute(
                "SELECT status, worker, cancel_reason FROM session_queue WHERE item_id = %s", (item_id,)
            ).fetchone()
        assert found is not None
        return {"status": found[0], "worker": found[1], "cancel_reason": found[2]}

    def image_records(self) -> dict[str, tuple[int | None, bool]]:
        """Every image record: name -> (the queue item that wrote it, of_incomplete_run)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute("SELECT image_name, queue_item_id, of_incomplete_run FROM images").fetchall()
        return {name: (item_id, bool(marked)) for name, item_id, marked in rows}

    def files(self) -> set[str]:
        return {path.name for path in self.outputs.iterdir() if path.is_file()}


@pytest.fixture(scope="module")
def cluster(postgres_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The module's two servers, started together (a start takes seconds: most of this module's time). Each test
    leaves both idle; the one that kills a server runs last."""
    name = f"faults_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = postgres_server.database_url(name)
    shared = tmp_path_factory.mktemp("shared")
    env = {key: value for key, value in os.environ.items() if not key.upper().startswith("INVOKEAI_")}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", INVOKEAI_DEVICE="cpu")
    servers = []
    try:
        for requeue in (False, True):
            root = tmp_path_factory.mktemp("requeues" if requeue else "cancels")
            (root / "invokeai.yaml").write_text(
                f"database_url: {url}\noutputs_dir: {shared / 'outputs'}\nmodels_dir: {shared / 'models'}\n"
                f"queue_lease_seconds: {LEASE_S}\nrequeue_interrupted: {str(requeue).lower()}\n"
                "install_demo_models: false\n"
            )
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            executable = str(Path(sys.executable).with_name("invokeai-web"))
            servers.append(ServerProcess(executable, root, port, root / "server.log", env))
        for server in servers:
            server.wait_up(timeout=120)
        yield Cluster(url, shared / "outputs", *servers)
    finally:
        for server in servers:
            if server.process.poll() is None:
                server.process.send_signal(signal.SIGCONT)
            server.kill()
        with psycopg.connect(postgres_server.url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    for server in servers:
        log = server.log.read_text()
        assert "Traceback" not in log, log[-3000:]


def _noise_png() -> bytes:
    image = Image.frombytes("RGB", (NOISE_SIDE, NOISE_SIDE), os.urandom(NOISE_SIDE * NOISE_SIDE * 3))
    data = io.BytesIO()
    image.save(data, format="PNG", compress_level=1)
    return data.getvalue()


def _enqueue(base: str, graph: dict[str, Any]) -> int:
    response = httpx.post(f"{base}{QUEUE}/enqueue_batch", json={"batch": {"graph": graph}}, timeout=30)
    assert response.status_code == 200, response.text
    [item_id] = response.json()["item_ids"]
    return int(item_id)


def _writer_of_temporary(outputs: Path, timeout: float = 30) -> tuple[int, Path]:
    """The pid whose image write is in progress (its .tmp-<host>-<pid>-<random>.png file exists), and that file."""

    def find() -> tuple[int, Path] | None:
        for path in outputs.glob(f"{TEMPORARY_PREFIX}*.png"):
            return int(path.name[len(TEMPORARY_PREFIX) :].split("-")[-2]), path
        return None

    return wait_until(find, timeout, "an image write to start", interval=0.001)


def _status(base: str) -> dict[str, Any]:
    response = httpx.get(f"{base}{QUEUE}/status", timeout=10)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _assert_every_file_recorded(cluster: Cluster) -> None:
    files = cluster.files()
    assert not [name for name in files if name.startswith(TEMPORARY_PREFIX)]
    assert files == set(cluster.image_records())


@pytest.mark.parametrize("requeue", [False, True], ids=["canceled", "requeued"])
def test_a_server_stopped_past_its_lease_in_a_png_write_writes_nothing_once_resumed(
    cluster: Cluster, requeue: bool
) -> None:
    # The survivor (the server whose setting the test is about) recovers the item; the other runs it. The survivor
    # is held (SIGSTOP) while the item is enqueued, so the runner is the one to claim it: no race decides.
    survivor = cluster.requeues if requeue else cluster.cancels
    runner = cluster.other(survivor)
    subscribers = [
        Subscriber(server.base, ("queue_item_status_changed", "invocation_complete")) for server in cluster.servers
    ]
    try:
        upload = httpx.post(
            f"{survivor.base}/api/v1/images/upload",
            params={"image_category": "user"},
            files={"file": ("noise.png", _noise_png(), "image/png")},
            timeout=60,
        )
        assert upload.status_code == 201, upload.text
        source = upload.json()["image_name"]
        # A small image first (recorded before the stop: the run's, then marked as of a run that did not
        # complete), then the noise blended with it: the large write the runner is stopped in.
        graph = graph_json(
            node("small", "blank_image", width=8, height=8, color="#00ff00"),
            node("large", "image_blend", image_a={"image_name": source}, alpha=0.25),
            edges=[edge("small", "image", "large", "image_b")],
        )
        os.kill(survivor.process.pid, signal.SIGSTOP)
        try:
            item_id = _enqueue(runner.base, graph)
            # The small image recorded: the next write is the large one.
            wait_until(
                lambda: item_id in {item for item, _ in cluster.image_records().values()},
                30,
                "the run's small image",
                interval=0.002,
            )
            pid, temporary = _writer_of_temporary(cluster.outputs)
            assert pid == runner.process.pid
            os.kill(pid, signal.SIGSTOP)
        finally:
            os.kill(survivor.process.pid, signal.SIGCONT)
        # Stopped inside the write: its file is still the temporary, and no record names it.
        assert temporary.exists()
        final = "completed" if requeue else "canceled"

        def ended() -> dict[str, Any] | None:
            row = cluster.row(item_id)
            return row if row["status"] in FINISHED else None

        row = wait_until(ended, 30, "the survivor to recover the stopped server's item")
        assert row["status"] == final
        if requeue:
            # Rerun on the survivor: the stopped server could not have run it.
            assert row["worker"].split("/", 1)[0].endswith(f":{survivor.process.pid}")
        else:
            assert row["cancel_reason"] == LEASE_EXPIRED_REASON
        recorded = cluster.image_records()

        os.kill(pid, signal.SIGCONT)
        # The resumed run finishes its write, finds its item no longer its own when it records it, removes its file
        # and stops: its worker idle, no temporary of it left.
        wait_until(
            lambda: not _status(runner.base)["processor"]["is_processing"] and not temporary.exists(),
            30,
            "the resumed server to let its run go",
        )
        wait_until(
            lambda: all(s.seen(final)[item_id] >= 1 for s in subscribers), 10, "each stream to see the item's end"
        )
        time.sleep(0.3)  # time for a repeat or a late event to show

        assert cluster.image_records() == recorded  # nothing recorded after the item was taken away
        mine = {name: marked for name, (item, marked) in recorded.items() if item == item_id}
        # The stopped run's small image, marked; the rerun's two (requeue), not.
        assert sorted(mine.values()) == ([False, False, True] if requeue else [True])
        listed = set(httpx.get(f"{survivor.base}/api/v1/images/names", timeout=10).json()["image_names"])
        assert {name for name, marked in mine.items() if not marked} <= listed
        assert not {name for name, marked in mine.items() if marked} & listed
        _assert_every_file_recorded(cluster)
        # prune removes the queue's finished items and the images of its runs that did not complete, files too.
        assert httpx.put(f"{survivor.base}{QUEUE}/prune", timeout=30).status_code == 200
        assert {name for name, (item, _) in cluster.image_records().items() if item == item_id} == {
            name for name, marked in mine.items() if not marked
        }
        _assert_every_file_recorded(cluster)
        for server, subscriber in zip(cluster.servers, subscribers, strict=True):
            assert _status(server.base)["queue"]["in_progress"] == 0
            for status in TERMINAL:
                assert subscriber.seen(status)[item_id] == (1 if status == final else 0), (server.base, status)
            # The stopped run's large node never announced a result: only its small one did, and the rerun's two.
            completed = subscriber.nodes(item_id, "invocation_complete")
            assert completed == (["small", "small", "large"] if requeue else ["small"]), server.base
    finally:
        for subscriber in subscribers:
            subscriber.close()


def test_a_server_killed_right_after_a_completion_loses_no_terminal_event(cluster: Cluster) -> None:
    # The item's completed event is sent with NOTIFY in the status change's transaction: a kill a few milliseconds
    # after the commit (before the relay's sender would have sent it) cannot keep it from the other server.
    subscribers = {server.base: Subscriber(server.base) for server in cluster.servers}
    try:
        item_id = _enqueue(cluster.servers[0].base, SMALL_IMAGE_GRAPH)
        with psycopg.connect(cluster.url, autocommit=True) as conn:

            def completed() -> str | None:
                found = conn.execute(
                    "SELECT worker FROM session_queue WHERE item_id = %s AND status = 'completed'", (item_id,)
                ).fetchone()
                return None if found is None else str(found[0])

            worker = wait_until(completed, 30, "the item to complete", interval=0.001)
        runner = cluster.by_pid(int(worker.split("/", 1)[0].rsplit(":", 1)[1]))
        runner.kill()
        survivor = cluster.other(runner)
        seen = subscribers[survivor.base]
        wait_until(lambda: seen.seen("completed")[item_id] == 1, 10, "the survivor's stream to see the completion")
        # The survivor goes on: a new item runs there.
        after = _enqueue(survivor.base, SMALL_IMAGE_GRAPH)
        wait_until(lambda: seen.seen("completed")[after] == 1, 30, "the survivor to run the next item")
        time.sleep(0.3)  # time for a repeat to show
        for status in TERMINAL:
            assert seen.seen(status)[item_id] == (1 if status == "completed" else 0), status
        assert cluster.row(item_id)["status"] == "completed"
        assert _status(survivor.base)["queue"]["in_progress"] == 0
        records = [record for record in cluster.image_records().values() if record[0] in (item_id, after)]
        assert sorted(records) == sorted([(item_id, False)] * 2 + [(after, False)] * 2)  # each item's two images
        _assert_every_file_recorded(cluster)
    finally:
        for subscriber in subscribers.values():
            subscriber.close()
