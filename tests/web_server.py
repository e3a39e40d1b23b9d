"""The one way the tests start a real `invokeai-web`: on a fresh root, on the CPU in float32 (what the stock pipelines
are compared in), one torch thread, its output in a log, stopped with SIGTERM as a user's Ctrl-C would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

# The address the in-process clients (Starlette's TestClient) send requests to: a name the server answers to by
# default (the Host check, invokeai/app/api/request_guard.py), where TestClient's own "testserver" is not.
LOCAL_BASE_URL = "http://localhost"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class WebServer:
    """invokeai-web on `root`, always on the same port (a restarted server is where its clients left it)."""

    def __init__(self, root: Path, **settings: str) -> None:
        """settings: more INVOKEAI_<NAME> settings for the server (e.g. web_ui)."""
        self.root = root
        self.settings = {f"INVOKEAI_{name.upper()}": value for name, value in settings.items()}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, api_token: str = "") -> None:
        env = {name: value for name, value in os.environ.items() if not name.upper().startswith("INVOKEAI_")}
        # One torch thread: the demo models gain nothing from more, and the test machine's cores are shared.
        env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HOME=str(self.root / "home"))
        env.update(INVOKEAI_DEVICE="cpu", INVOKEAI_PRECISION="float32", **self.settings)
        if api_token:
            env["INVOKEAI_API_TOKEN"] = api_token
        executable = Path(sys.executable).with_name("invokeai-web")
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(executable), "--root", str(self.root / "invokeai"), "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + 180
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"invokeai-web exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                # Any answer (a 401 with a token) means it serves; the demo models are installed before it does.
                httpx.get(f"{self.base}/api/v1/app/version", timeout=5)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    pytest.fail(f"invokeai-web did not answer:\n{self.log.read_text()}")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, api_token: str = "") -> None:
        self.stop()
        self.start(api_token)

    def traceback_free_log(self) -> None:
        """Fails the test where the server logged a traceback (an error it did not turn into a clear answer)."""
        log = self.log.read_text()
        assert "Traceback" not in log, log

    @classmethod
    @contextmanager
    def running(cls, root: Path, **settings: str) -> Iterator[WebServer]:
        """A started server for a fixture's lifetime: stopped whatever happens, then its log checked for tracebacks."""
        server = cls(root, **settings)
        server.start()
        try:
            yield server
        finally:
            server.stop()
        server.traceback_free_log()
