"""A real `invokeai-web` on a fresh root (which installs every family's demo models at its first start), one per
test module that asks for `server`, and a client of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_support import free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """invokeai-web on a fresh root, on the CPU in float32 (what the stock pipelines are compared in); its base URL
    once it answers (the demo models are installed by then)."""
    root = tmp_path_factory.mktemp("generation-server")
    env = {name: value for name, value in os.environ.items() if not name.upper().startswith("INVOKEAI_")}
    # One torch thread: the demo models gain nothing from more, and the test machine's cores are shared.
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HOME=str(root / "home"))
    env.update(INVOKEAI_DEVICE="cpu", INVOKEAI_PRECISION="float32")
    executable = Path(sys.executable).with_name("invokeai-web")
    port = free_port()
    log = root / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(executable), "--root", str(root / "invokeai"), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                pytest.fail(f"invokeai-web exited with {process.returncode}:\n{log.read_text()}")
            try:
                httpx.get(f"{base}/api/v1/app/version", timeout=5)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    pytest.fail(f"invokeai-web did not answer:\n{log.read_text()}")
                time.sleep(0.2)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as client:
        yield client
