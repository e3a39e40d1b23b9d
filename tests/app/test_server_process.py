"""The real `invokeai-web` in a subprocess: first start on a fresh root, answers, stops cleanly on a signal."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import pytest

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\] [\w.]+: ")
SIGNALS = pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])


@pytest.fixture
def start_server(tmp_path: Path, invokeai_web: str, child_env: Callable[..., dict[str, str]]) -> Callable[..., Any]:
    """start_server(root, port): a context manager around a running invokeai-web, logging to tmp_path/server.log."""

    @contextmanager
    def start(root: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
        with (tmp_path / "server.log").open("wb") as log_file:
            process = subprocess.Popen(
                [invokeai_web, "--root", str(root), "--port", str(port)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=child_env(),
            )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    return start


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def wait_until_up(process: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"invokeai-web exited with {process.returncode}:\n{log.read_text()}")
        try:
            get_json(url)
            return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"invokeai-web did not answer within {timeout} s:\n{log.read_text()}")


@SIGNALS
def test_serves_on_fresh_root_and_exits_0_on_signal(
    tmp_path: Path, start_server: Callable[..., Any], free_port: int, stop_signal: signal.Signals
) -> None:
    root = tmp_path / "fresh-root"
    log = tmp_path / "server.log"
    base = f"http://127.0.0.1:{free_port}/api/v1/app"
    with start_server(root, free_port) as process:
        wait_until_up(process, f"{base}/version", log)
        assert get_json(f"{base}/version") == {"version": installed_version("invokeai")}
        config = get_json(f"{base}/config")
        assert config["config"]["port"] == free_port
        assert config["root"] == str(root)
        assert (root / "invokeai.yaml").exists()

        process.send_signal(stop_signal)
        returncode = process.wait(timeout=30)

    output = log.read_text()
    assert returncode == 0, output
    assert "Traceback" not in output
    lines = output.splitlines()
    assert any("uvicorn.error: Finished server process" in line for line in lines), output
    assert lines[-1].endswith("invokeai.app.run_app: Stopped")  # run_app's code after uvicorn ran
    assert [line for line in lines if not LOG_LINE.match(line)] == []


@SIGNALS
def test_signal_during_startup_exits_0(
    tmp_path: Path, start_server: Callable[..., Any], stop_signal: signal.Signals
) -> None:
    log = tmp_path / "server.log"
    with start_server(tmp_path / "root", 0) as process:
        # The first log line comes before the attention kernels (and torch) load: seconds before uvicorn runs.
        deadline = time.monotonic() + 60
        while "invokeai.app.run_app: InvokeAI" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(stop_signal)
        returncode = process.wait(timeout=30)

    output = log.read_text()
    assert returncode == 0, output
    assert "Traceback" not in output
    assert "Uvicorn running" not in output  # the signal did arrive before the server ran
