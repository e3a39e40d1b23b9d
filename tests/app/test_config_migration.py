"""An older schema_version is migrated on load, with a .bak copy; a failed load rewrites nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from invokeai.app.config import CliArgs, ConfigError, load_config
from invokeai.app.config.migrations import CURRENT_SCHEMA_VERSION

V1_FILE = "# my settings\nschema_version: 1\nport: 9100\nattention_type: xformers\nattention_slice_size: 4\n"


def test_v1_file_is_migrated_with_backup(tmp_path: Path) -> None:
    path = tmp_path / "invokeai.yaml"
    path.write_text(V1_FILE)
    loaded = load_config(CliArgs(root=tmp_path))

    assert loaded.config.attention_backend == "efficient"
    assert loaded.config.port == 9100
    assert loaded.migrated_from == 1
    assert loaded.backup == tmp_path / "invokeai.yaml.bak"
    assert (tmp_path / "invokeai.yaml.bak").read_text() == V1_FILE
    assert yaml.safe_load(path.read_text()) == {
        "schema_version": CURRENT_SCHEMA_VERSION,
        "port": 9100,
        "attention_backend": "efficient",
    }
    assert any("attention_slice_size" in note for note in loaded.notes)


def test_migrated_file_loads_without_another_migration(tmp_path: Path) -> None:
    (tmp_path / "invokeai.yaml").write_text(V1_FILE)
    load_config(CliArgs(root=tmp_path))
    again = load_config(CliArgs(root=tmp_path))
    assert again.migrated_from is None
    assert again.config.attention_backend == "efficient"
    assert not (tmp_path / "invokeai.yaml.bak.1").exists()


@pytest.mark.parametrize(
    ("old", "new"),
    [("auto", "auto"), ("torch-sdp", "auto"), ("normal", "auto"), ("sliced", "auto"), ("xformers", "efficient")],
)
def test_v1_attention_types_map_forward(tmp_path: Path, old: str, new: str) -> None:
    (tmp_path / "invokeai.yaml").write_text(f"schema_version: 1\nattention_type: {old}\n")
    assert load_config(CliArgs(root=tmp_path)).config.attention_backend == new


def test_existing_backup_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "invokeai.yaml").write_text(V1_FILE)
    (tmp_path / "invokeai.yaml.bak").write_text("older backup\n")
    loaded = load_config(CliArgs(root=tmp_path))
    assert loaded.backup == tmp_path / "invokeai.yaml.bak.1"
    assert (tmp_path / "invokeai.yaml.bak").read_text() == "older backup\n"
    assert (tmp_path / "invokeai.yaml.bak.1").read_text() == V1_FILE


def test_migration_of_a_file_left_empty(tmp_path: Path) -> None:
    (tmp_path / "invokeai.yaml").write_text("schema_version: 1\nattention_slice_size: 4\n")
    load_config(CliArgs(root=tmp_path))
    assert yaml.safe_load((tmp_path / "invokeai.yaml").read_text()) == {"schema_version": CURRENT_SCHEMA_VERSION}


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("schema_version: 1\nattention_type: warp\n", {}, "'attention_type' is 'warp'; allowed in schema_version 1"),
        ("schema_version: 1\nattention_type: xformers\nport: lots\n", {}, "'port' is 'lots'"),
        ("schema_version: 1\nattention_type: xformers\n", {"INVOKEAI_DEVICE": "gpu"}, "INVOKEAI_DEVICE is 'gpu'"),
    ],
)
def test_failed_load_rewrites_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, env: dict[str, str], expected: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "invokeai.yaml").write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_config(CliArgs(root=tmp_path))
    assert (tmp_path / "invokeai.yaml").read_text() == text
    assert not (tmp_path / "invokeai.yaml.bak").exists()


def test_file_without_schema_version_is_current_and_untouched(tmp_path: Path) -> None:
    (tmp_path / "invokeai.yaml").write_text("attention_backend: math\n")
    loaded = load_config(CliArgs(root=tmp_path))
    assert loaded.migrated_from is None
    assert (tmp_path / "invokeai.yaml").read_text() == "attention_backend: math\n"
