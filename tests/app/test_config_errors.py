"""Bad input stops startup with exit code 2 and one line naming the source, key, value and what is allowed."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from invokeai.app.config import CliArgs, ConfigError, load_config
from invokeai.app.config.describe import SETTINGS

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
        (
            "allowed_hosts: [mybox.lan:9090]\n",
            "'allowed_hosts' is ['mybox.lan:9090']; 'mybox.lan:9090' is not allowed; allowed: a list of host names "
            "without a port",
        ),
        (
            "allowed_origins: localhost:5173\n",
            "'allowed_origins' is 'localhost:5173'; 'localhost:5173' is not allowed; allowed: a list of origins, "
            "scheme://host[:port]",
        ),
        ("allowed_origins: [http://ui.lan/app]\n", "'http://ui.lan/app' is not allowed; allowed: a list of origins"),
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


def test_every_problem_of_a_file_is_one_line_in_file_order(tmp_path: Path) -> None:
    # Unknown keys used to stop the load before any value was checked: only 'attention_backed' was reported.
    message = load_error(tmp_path, "attention_backed: auto\nport: 99999\nlog_level: loud\nzzz: 1\n")
    path = tmp_path / "invokeai.yaml"
    assert message.splitlines() == [
        f"{path}: unknown setting 'attention_backed' (did you mean 'attention_backend'?)",
        f"{path}: 'port' is 99999; expected an integer from 0 to 65535",
        f"{path}: 'log_level' is 'loud'; allowed: debug, info, warning, error, critical",
        f"{path}: unknown setting 'zzz' (known settings: {', '.join(SETTINGS)})",
    ]


def test_file_environment_and_option_problems_come_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOKEAI_MAX_CACHE_RAM_GB", "inf")
    message = load_error(tmp_path, "attention_backed: auto\n", port="1_000")
    assert message.splitlines() == [
        f"{tmp_path / 'invokeai.yaml'}: unknown setting 'attention_backed' (did you mean 'attention_backend'?)",
        "environment variable INVOKEAI_MAX_CACHE_RAM_GB is 'inf'; expected a finite number of at least 0",
        "option --port is '1_000'; expected an integer from 0 to 65535",
    ]


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("port: true\n", "'port' is true; expected an integer from 0 to 65535"),
        ("port: false\n", "'port' is false; expected an integer"),
        ("port: 9090.0\n", "'port' is 9090.0; expected an integer"),
        ('max_queue_size: "1_000"\n', "'max_queue_size' is '1_000'; expected an integer from 1 to 1000000"),
        ('max_upload_mb: "0x10"\n', "'max_upload_mb' is '0x10'; expected an integer from 1 to 2048"),
        ('max_upload_mb: "٣"\n', "'max_upload_mb' is '٣'; expected an integer"),
        ('host: ""\n', "'host' is ''; allowed: a host name or IP address"),
        ('host: "local host"\n', "'host' is 'local host'; allowed: a host name or IP address"),
        ("max_cache_ram_gb: .inf\n", "'max_cache_ram_gb' is inf; expected a finite number of at least 0"),
        ("max_cache_ram_gb: .nan\n", "'max_cache_ram_gb' is nan; expected a finite number"),
        ('max_cache_ram_gb: "1e999"\n', "'max_cache_ram_gb' is '1e999'; expected a finite number"),
        ('max_cache_ram_gb: "1_0"\n', "'max_cache_ram_gb' is '1_0'; expected a finite number"),
        ("max_cache_ram_gb: true\n", "'max_cache_ram_gb' is true; expected a finite number"),
        (f"device_working_mem_gb: {10**400}\n", "'device_working_mem_gb' is 1000"),
        ('models_dir: ""\n', "'models_dir' is ''; expected a path"),
    ],
)
def test_values_are_taken_as_written(tmp_path: Path, yaml_text: str, expected: str) -> None:
    assert expected in load_error(tmp_path, yaml_text)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("INVOKEAI_MAX_CACHE_RAM_GB", "inf"),
        ("INVOKEAI_MAX_CACHE_RAM_GB", "-Infinity"),
        ("INVOKEAI_MAX_CACHE_RAM_GB", "NaN"),
        ("INVOKEAI_MAX_CACHE_RAM_GB", "1e999"),
        ("INVOKEAI_PORT", "1_000"),
        ("INVOKEAI_PORT", "0x10"),
        ("INVOKEAI_HOST", ""),
        ("INVOKEAI_OUTPUTS_DIR", " "),
    ],
)
def test_environment_values_are_taken_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert load_error(tmp_path, None).startswith(f"environment variable {variable} is {value!r}; ")


@pytest.mark.parametrize(
    ("yaml_text", "name", "value"),
    [
        ('port: "9091"\n', "port", 9091),
        ('port: " 9091 "\n', "port", 9091),
        ("port: +9091\n", "port", 9091),
        ("max_cache_ram_gb: 2\n", "max_cache_ram_gb", 2.0),
        ('max_cache_ram_gb: "2.5"\n', "max_cache_ram_gb", 2.5),
        ('max_cache_ram_gb: "1e3"\n', "max_cache_ram_gb", 1000.0),
        ('max_cache_ram_gb: ".5"\n', "max_cache_ram_gb", 0.5),
        ("host: '::'\n", "host", "::"),
    ],
)
def test_plain_values_are_still_read(tmp_path: Path, yaml_text: str, name: str, value: object) -> None:
    (tmp_path / "invokeai.yaml").write_text(yaml_text)
    config = load_config(CliArgs(root=tmp_path)).config
    assert getattr(config, name) == value and type(getattr(config, name)) is type(value)


@pytest.mark.parametrize(("option", "value"), [("--port", "1_000"), ("--port", "true"), ("--host", "")])
def test_console_script_options_are_taken_as_written(
    tmp_path: Path, run_invokeai_web: Run, option: str, value: str
) -> None:
    # argparse's int() read "--port 1_000" as port 1000.
    result = run_invokeai_web("--root", str(tmp_path / "root"), option, value)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"invokeai-web: error: option {option} is {value!r}; ")
    assert "Traceback" not in result.stderr


def test_console_script_lists_every_problem_of_a_file(tmp_path: Path, run_invokeai_web: Run) -> None:
    (tmp_path / "invokeai.yaml").write_text("attention_backed: auto\nport: 99999\nlog_level: loud\n")
    result = run_invokeai_web("--root", str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith("invokeai-web: error: ") for line in lines), result.stderr
    assert ["attention_backed" in lines[0], "99999" in lines[1], "loud" in lines[2]] == [True, True, True]


def test_unknown_environment_variables_are_warnings_naming_the_closest_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INVOKEAI_ATENTION_BACKEND", "efficient")
    monkeypatch.setenv("invokeai_prot", "9000")
    monkeypatch.setenv("INVOKEAI_QQQQQQ", "1")
    monkeypatch.setenv("INVOKEAI_ROOT", str(tmp_path))  # not a setting, but read: no warning
    monkeypatch.setenv("INVOKEAI_PORT", "9100")
    loaded = load_config(CliArgs(root=tmp_path))
    assert loaded.config.attention_backend == "auto"  # the misspelt variable changes nothing
    assert loaded.warnings == [
        "environment variable INVOKEAI_ATENTION_BACKEND is not a setting, so it is ignored "
        "(did you mean INVOKEAI_ATTENTION_BACKEND, setting 'attention_backend'?)",
        "environment variable INVOKEAI_QQQQQQ is not a setting, so it is ignored (see docs/configuration.md)",
        "environment variable invokeai_prot is not a setting, so it is ignored "
        "(did you mean INVOKEAI_PORT, setting 'port'?)",
    ]


def test_known_environment_variables_give_no_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("invokeai_attention_backend", "math")
    monkeypatch.setenv("INVOKEAI_ROOT", str(tmp_path))
    assert load_config(CliArgs(root=tmp_path)).warnings == []
