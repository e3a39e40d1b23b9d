"""First start: invokeai-web installs the demo models on a root without models, once; the setting turns it off."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from model_test_support import MODELS, models_dir_files
from web_server import LOCAL_BASE_URL

from invokeai.app.api.app_factory import create_app
from invokeai.app.config import InvokeAIAppConfig
from invokeai.backend.families.registry import FAMILIES

# Every registered family's demo models, as the server lists them (by name), and where each is installed.
DEMO_NAMES = sorted(demo.name for family in FAMILIES for demo in family.demos)
DEMO_PATHS = {f"{family.name}/{demo.filename}" for family in FAMILIES for demo in family.demos}
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\] [\w.]+: ")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _serve_and_list(invokeai_web: str, root: Path, port: int, env: dict[str, str], log: Path) -> list[dict[str, Any]]:
    """Start invokeai-web, list its models once it answers, stop it with SIGTERM."""
    with log.open("ab") as log_file:
        process = subprocess.Popen(
            [invokeai_web, "--root", str(root), "--port", str(port)], stdout=log_file, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                models: list[dict[str, Any]] = _get(f"http://127.0.0.1:{port}{MODELS}/")["models"]
                break
            except OSError:
                time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()
        return models
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_first_start_installs_the_demo_models_and_a_restart_keeps_them(
    tmp_path: Path, invokeai_web: str, free_port: int, child_env: Callable[..., dict[str, str]]
) -> None:
    root, log = tmp_path / "root", tmp_path / "server.log"
    env = child_env(INVOKEAI_INSTALL_DEMO_MODELS="true")
    first = _serve_and_list(invokeai_web, root, free_port, env, log)
    assert [m["name"] for m in first] == DEMO_NAMES
    assert all("random-weight" in m["description"].lower() for m in first)
    assert {Path(m["path"]).relative_to(root / "models").as_posix() for m in first} == DEMO_PATHS
    output = log.read_text()
    assert output.count(f"Installed {len(DEMO_NAMES)} demo models") == 1, output
    # The libraries' own stderr output (warnings, progress bars) goes through the server's log format.
    assert [line for line in output.splitlines() if not LOG_LINE.match(line)] == []

    assert _serve_and_list(invokeai_web, root, free_port, env, log) == first
    assert log.read_text().count("demo models") == 1


def test_the_setting_off_installs_nothing(make_app_client: Callable[..., TestClient]) -> None:
    client = make_app_client(demo_models=True, install_demo_models=False)
    assert client.get(f"{MODELS}/").json() == {"models": []}
    assert models_dir_files(client) == []


def test_demo_files_without_records_are_rebuilt_and_recorded(tmp_path: Path) -> None:
    # An in-memory database forgets its records at every start, while the files stay under models_dir.
    config = InvokeAIAppConfig.located({"use_memory_db": True}, tmp_path, None)
    with TestClient(create_app(config, run_processor=False, demo_models=True), base_url=LOCAL_BASE_URL) as first:
        files = models_dir_files(first)
    with TestClient(create_app(config, run_processor=False, demo_models=True), base_url=LOCAL_BASE_URL) as again:
        assert [m["name"] for m in again.get(f"{MODELS}/").json()["models"]] == DEMO_NAMES
        assert models_dir_files(again) == files
