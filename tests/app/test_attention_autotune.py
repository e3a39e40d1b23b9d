"""The `attention_autotune` setting end to end: its values and errors, the server started with it on, and the tuned
choices in GET /api/v1/app/attention."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fastapi.encoders import jsonable_encoder
from fastapi.testclient import TestClient
from web_server import LOCAL_BASE_URL

from invokeai.app.api.app_factory import create_app
from invokeai.app.config import CliArgs, ConfigError, load_config

Run = Callable[..., subprocess.CompletedProcess[str]]


def test_a_bad_environment_value_exits_2_naming_the_valid_values(tmp_path: Path, run_invokeai_web: Run) -> None:
    result = run_invokeai_web("--root", str(tmp_path / "root"), env={"INVOKEAI_ATTENTION_AUTOTUNE": "sometimes"})
    assert result.returncode == 2
    assert result.stderr == (
        "invokeai-web: error: environment variable INVOKEAI_ATTENTION_AUTOTUNE is 'sometimes'; allowed: off, on\n"
    )
    assert "Traceback" not in result.stdout + result.stderr


def test_a_bad_file_value_names_the_valid_values(tmp_path: Path) -> None:
    (tmp_path / "invokeai.yaml").write_text("attention_autotune: maybe\n")
    with pytest.raises(ConfigError) as caught:
        load_config(CliArgs(root=tmp_path))
    assert "'attention_autotune' is 'maybe'; allowed: off, on" in str(caught.value)


@pytest.mark.parametrize(
    ("written", "read"), [("on", "on"), ("off", "off"), ("'on'", "on"), ('"off"', "off"), (None, "off")]
)
def test_on_and_off_are_read_quoted_or_not(tmp_path: Path, written: str | None, read: str) -> None:
    # YAML 1.1 reads an unquoted on or off as a boolean.
    (tmp_path / "invokeai.yaml").write_text("" if written is None else f"attention_autotune: {written}\n")
    assert load_config(CliArgs(root=tmp_path)).config.attention_autotune == read


@pytest.fixture
def pristine() -> Iterator[None]:
    from invokeai.backend.attention.testing import pristine_attention

    with pristine_attention():
        yield


def test_the_api_shows_the_tuned_choices(tmp_path: Path, pristine: None) -> None:
    from invokeai.backend.attention import attention_stats, install_attention

    client = TestClient(create_app(load_config(CliArgs(root=tmp_path)).config), base_url=LOCAL_BASE_URL)
    install_attention("auto", device="cpu", autotune=True, autotune_file=tmp_path / "attention_autotune.json")
    body = client.get("/api/v1/app/attention").json()
    assert body["autotune"] == "on" and body["tuned"] == [] and "autotune" in body["layers"]
    assert body["autotune_file"] == str(tmp_path / "attention_autotune.json")
    q = torch.randn(1, 4, 77, 32)
    F.scaled_dot_product_attention(q, q, q)
    body = client.get("/api/v1/app/attention").json()
    assert body == jsonable_encoder(attention_stats())
    (choice,) = body["tuned"]
    assert choice["bucket"] == {
        "device": "cpu",
        "dtype": "float32",
        "head_dim": 32,
        "query_len": 128,
        "key_len": 128,
        "heads": 4,
        "grouped": False,
        "mask": "none",
    }
    assert choice["kernel"] in ("FLASH_ATTENTION", "MATH") and choice["source"] == "measured"
    assert [timing["kernel"] for timing in choice["timings"]] == ["FLASH_ATTENTION", "MATH"]
    assert (
        choice["kernel"] == min((t for t in choice["timings"] if t["ms"] is not None), key=lambda t: t["ms"])["kernel"]
    )


def test_the_openapi_schema_describes_the_tuned_choices(tmp_path: Path) -> None:
    schema = (
        TestClient(create_app(load_config(CliArgs(root=tmp_path)).config), base_url=LOCAL_BASE_URL)
        .get("/openapi.json")
        .json()
    )
    stats = schema["components"]["schemas"]["AttentionStats"]["properties"]
    assert {"autotune", "autotune_file", "tuned"} <= set(stats)
    assert stats["autotune"]["description"].startswith("The attention_autotune setting in force")
    assert "TunedChoice" in schema["components"]["schemas"] and "TunedBucket" in schema["components"]["schemas"]


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_the_server_starts_with_autotuning_on(
    tmp_path: Path, invokeai_web: str, child_env: Callable[..., dict[str, str]], free_port: int
) -> None:
    root, log = tmp_path / "root", tmp_path / "server.log"
    env = child_env(INVOKEAI_ATTENTION_AUTOTUNE="on", INVOKEAI_INSTALL_DEMO_MODELS="false", INVOKEAI_DEVICE="cpu")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [invokeai_web, "--root", str(root), "--port", str(free_port)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        base = f"http://127.0.0.1:{free_port}/api/v1/app"
        deadline = time.monotonic() + 90
        body = None
        while body is None and time.monotonic() < deadline and process.poll() is None:
            try:
                body = _get_json(f"{base}/attention")
            except OSError:
                time.sleep(0.2)
        assert body is not None, log.read_text()
        assert body["autotune"] == "on" and "autotune" in body["layers"]
        assert body["autotune_file"] == str(root / "attention_autotune.json")
        assert body["tuned"] == []  # nothing has run yet
        assert _get_json(f"{base}/config")["config"]["attention_autotune"] == "on"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert "attention_autotune 'on': the first call of each shape bucket times the kernels" in output
    assert "Traceback" not in output
