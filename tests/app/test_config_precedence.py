"""Sources, highest first: command line, environment, invokeai.yaml, defaults; and where paths resolve."""

from __future__ import annotations

from pathlib import Path

import pytest

from invokeai.app.config import CliArgs, InvokeAIAppConfig, load_config


def load(root: Path, yaml_text: str | None = None, **cli: object) -> InvokeAIAppConfig:
    if yaml_text is not None:
        root.mkdir(parents=True, exist_ok=True)
        (root / "invokeai.yaml").write_text(yaml_text)
    return load_config(CliArgs(root=root, overrides=dict(cli))).config


def test_defaults_without_file_env_or_options(tmp_path: Path) -> None:
    config = load(tmp_path / "root")
    assert (config.host, config.port, config.attention_backend, config.device) == ("127.0.0.1", 9090, "auto", "auto")
    assert config.log_level == "info"
    assert config.use_memory_db is False


def test_file_beats_default(tmp_path: Path) -> None:
    config = load(tmp_path, "port: 9100\nattention_backend: efficient\n")
    assert config.port == 9100
    assert config.attention_backend == "efficient"


def test_env_beats_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOKEAI_PORT", "9200")
    monkeypatch.setenv("INVOKEAI_ATTENTION_BACKEND", "math")
    config = load(tmp_path, "port: 9100\nattention_backend: efficient\nhost: 0.0.0.0\n")
    assert config.port == 9200
    assert config.attention_backend == "math"
    assert config.host == "0.0.0.0"  # not in the environment: the file's value stands


def test_env_names_are_case_insensitive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("invokeai_port", "9300")
    assert load(tmp_path).port == 9300


def test_command_line_beats_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOKEAI_PORT", "9200")
    monkeypatch.setenv("INVOKEAI_HOST", "10.0.0.1")
    config = load(tmp_path, "port: 9100\nhost: 0.0.0.0\n", port=9400)
    assert config.port == 9400
    assert config.host == "10.0.0.1"  # no --host given: the environment's value stands


def test_parsed_command_line_reaches_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from invokeai.app.config import parse_args

    monkeypatch.setenv("INVOKEAI_HOST", "10.0.0.1")
    args = parse_args(["--root", str(tmp_path), "--host", "0.0.0.0", "--port", "9500"], "test")
    config = load_config(args).config
    assert (config.host, config.port, config.root) == ("0.0.0.0", 9500, tmp_path.resolve())


def test_root_from_option_else_env_else_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config(CliArgs()).config.root == Path.home() / "invokeai"
    monkeypatch.setenv("INVOKEAI_ROOT", str(tmp_path / "from-env"))
    assert load_config(CliArgs()).config.root == tmp_path / "from-env"
    assert load_config(CliArgs(root=tmp_path / "from-option")).config.root == tmp_path / "from-option"


def test_root_file_is_read_from_env_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "invokeai.yaml").write_text("port: 9600\n")
    monkeypatch.setenv("INVOKEAI_ROOT", str(tmp_path))
    assert load_config(CliArgs()).config.port == 9600


def test_config_option_reads_another_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "invokeai.yaml").write_text("port: 9100\n")
    other = tmp_path / "elsewhere.yaml"
    other.write_text("port: 9700\nmodels_dir: my-models\n")
    config = load_config(CliArgs(root=root, config=other)).config
    assert config.port == 9700
    assert config.config_file == other
    # Relative paths resolve against the root, not the folder of the file that named them.
    assert config.models_path == root / "my-models"


def test_relative_paths_resolve_against_root_absolute_stay(tmp_path: Path) -> None:
    absolute = tmp_path / "abs-outputs"
    config = load(tmp_path, f"outputs_dir: {absolute}\n")
    assert config.models_path == tmp_path / "models"
    assert config.db_file == tmp_path / "databases" / "invokeai.db"
    assert config.outputs_path == absolute
