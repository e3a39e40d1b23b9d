"""Bad input stops startup with exit code 2 and one line naming the source, key, value and what is allowed."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from invokeai.app.config import CliArgs, ConfigError, load_config

ALLOWED_BACKENDS = "allowed: auto, sage, cudnn, flash, efficient, math"

Run = Callable[..., subprocess.CompletedProcess[str]]


def load_error(root: Path, yaml_text: str | None, **cli: object) -> str:
    if yaml_text is not None:
        (root / "invokeai.yaml").write_text(yaml_text)
    with pytest.raises(ConfigError) as caught:
        load_config(CliArgs(root=root, overrides=dict(cli)))
    return str(caught.value)


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("attention_backend: fast\n", f"'attention_backend' is 'fast'; {ALLOWED_BACKENDS}"),
        ("attention_backed: auto\n", "unknown setting 'attention_backed' (did you mean 'attention_backend'?)"),
        ("port: lots\n", "'port' is 'lots'; expected an integer from 0 to 65535"),
        ("port: 70000\n", "'port' is 70000; expected an integer from 0 to 65535"),
        ("host: 8\n", "'host' is 8; allowed: a host name or IP address"),
        ("use_memory_db: maybe\n", "'use_memory_db' is 'maybe'; expected true or false"),
        ("device: gpu\n", "'device' is 'gpu'; allowed: auto, cpu, cuda, cuda:N, mps, xpu"),
        ("models_dir:\n", "'models_dir' is empty; expected a path"),
        ("attention_backend: [auto\n", "YAML syntax error at line 2"),
        ("port: 1\n  host: x\n", "YAML syntax error at line 2"),
        ("- port\n", "expected 'setting: value' lines, found a YAML list"),
        (
            "schema_version: 99\n",
            "'schema_version' is 99; expected an integer from 1 to 2 (the file was written by a newer",
        ),
        ("schema_version: two\n", "'schema_version' is 'two'"),
    ],
)
def test_bad_file_names_file_key_value_and_allowed(tmp_path: Path, yaml_text: str, expected: str) -> None:
    message = load_error(tmp_path, yaml_text)
    assert message.startswith(f"{tmp_path / 'invokeai.yaml'}: ")
    assert expected in message


def test_unknown_key_without_close_match_lists_the_settings(tmp_path: Path) -> None:
    message = load_error(tmp_path, "zzz: 1\n")
    assert "unknown setting 'zzz'" in message
    assert "attention_backend" in message and "port" in message


def test_every_bad_value_is_reported_one_per_line(tmp_path: Path) -> None:
    message = load_error(tmp_path, "port: lots\nattention_backend: fast\n")
    assert len(message.splitlines()) == 2


def test_env_error_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOKEAI_ATTENTION_BACKEND", "nope")
    message = load_error(tmp_path, "attention_backend: efficient\n")
    assert message == f"environment variable INVOKEAI_ATTENTION_BACKEND is 'nope'; {ALLOWED_BACKENDS}"


def test_option_error_names_the_option(tmp_path: Path) -> None:
    assert load_error(tmp_path, None, port=70000) == "option --port is 70000; expected an integer from 0 to 65535"


def test_each_source_is_checked_even_where_a_higher_one_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INVOKEAI_PORT", "lots")
    message = load_error(tmp_path, "port: many\n", port=0)
    assert message.splitlines() == [
        f"{tmp_path / 'invokeai.yaml'}: 'port' is 'many'; expected an integer from 0 to 65535",
        "environment variable INVOKEAI_PORT is 'lots'; expected an integer from 0 to 65535",
    ]


def test_missing_config_option_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(CliArgs(root=tmp_path, config=tmp_path / "missing.yaml"))


def test_failed_load_keeps_the_file(tmp_path: Path) -> None:
    text = "# mine\nattention_backend: fast\n"
    load_error(tmp_path, text)
    assert (tmp_path / "invokeai.yaml").read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["invokeai.yaml"]


@pytest.mark.parametrize(
    ("yaml_text", "words"),
    [
        ("attention_backend: fast\n", ["'attention_backend' is 'fast'", ALLOWED_BACKENDS]),
        ("attention_backed: auto\n", ["unknown setting 'attention_backed'", "did you mean 'attention_backend'?"]),
        ("port: lots\n", ["'port' is 'lots'", "expected an integer"]),
        ("attention_backend: [auto\n", ["YAML syntax error at line 2"]),
    ],
)
def test_console_script_exits_2_without_traceback(
    tmp_path: Path, run_invokeai_web: Run, yaml_text: str, words: list[str]
) -> None:
    (tmp_path / "invokeai.yaml").write_text(yaml_text)
    result = run_invokeai_web("--root", str(tmp_path), "--port", "0")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.startswith(f"invokeai-web: error: {tmp_path / 'invokeai.yaml'}: ")
    for word in words:
        assert word in result.stderr
    assert (tmp_path / "invokeai.yaml").read_text() == yaml_text


def test_console_script_env_error_exits_2(tmp_path: Path, run_invokeai_web: Run) -> None:
    result = run_invokeai_web("--root", str(tmp_path / "root"), env={"INVOKEAI_ATTENTION_BACKEND": "nope"})
    assert result.returncode == 2
    assert (
        result.stderr
        == f"invokeai-web: error: environment variable INVOKEAI_ATTENTION_BACKEND is 'nope'; {ALLOWED_BACKENDS}\n"
    )
    assert not (tmp_path / "root").exists()  # nothing is created when the configuration is bad


def test_console_script_bad_option_exits_2(tmp_path: Path, run_invokeai_web: Run) -> None:
    result = run_invokeai_web("--root", str(tmp_path), "--port", "many")
    assert result.returncode == 2
    assert "--port" in result.stderr and "many" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_secret_value_is_not_shown(tmp_path: Path) -> None:
    message = load_error(tmp_path, "api_token: [hunter2]\n")
    assert "'api_token' is (hidden: a secret setting); expected a string" in message
    assert "hunter2" not in message
