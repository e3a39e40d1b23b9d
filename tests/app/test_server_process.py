"""The real `invokeai-web` in a subprocess: first start on a fresh root, answers, stops cleanly on a signal."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import pytest

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\] [\w.]+: ")


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
    process.kill()
    pytest.fail(f"invokeai-web did not answer within {timeout} s:\n{log.read_text()}")


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serves_on_fresh_root_and_exits_0_on_signal(
    tmp_path: Path,
    invokeai_web: str,
    child_env: Callable[..., dict[str, str]],
    free_port: int,
    stop_signal: signal.Signals,
) -> None:
    root = tmp_path / "fresh-root"
    port = free_port
    log = tmp_path / "server.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [invokeai_web, "--root", str(root), "--port", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
    base = f"http://127.0.0.1:{port}/api/v1/app"
    try:
        wait_until_up(process, f"{base}/version", log)
        assert get_json(f"{base}/version") == {"version": installed_version("invokeai")}
        config = get_json(f"{base}/config")
        assert config["config"]["port"] == port
        assert config["root"] == str(root)
        assert (root / "invokeai.yaml").exists()

        process.send_signal(stop_signal)
        returncode = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    output = log.read_text()
    assert returncode == 0, output
    assert "Traceback" not in output
    lines = output.splitlines()
    assert any("uvicorn.error: Finished server process" in line for line in lines), output
    assert lines[-1].endswith("invokeai.app.run_app: Stopped")  # run_app's code after uvicorn ran
    assert [line for line in lines if not LOG_LINE.match(line)] == []


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_startup_exits_0(
    tmp_path: Path, invokeai_web: str, child_env: Callable[..., dict[str, str]], stop_signal: signal.Signals
) -> None:
    log = tmp_path / "server.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [invokeai_web, "--root", str(tmp_path / "root"), "--port", "0"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
    try:
        # The first log line comes before the attention kernels (and torch) load: seconds before uvicorn runs.
        deadline = time.monotonic() + 60
        while "invokeai.app.run_app: InvokeAI" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(stop_signal)
        returncode = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert returncode == 0, output
    assert "Traceback" not in output
    assert "Uvicorn running" not in output  # the signal did arrive before the server ran
