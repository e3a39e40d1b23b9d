"""The first start creates the root with a commented invokeai.yaml that loads back to the defaults."""

from __future__ import annotations

from pathlib import Path

import yaml

from invokeai.app.config import CliArgs, InvokeAIAppConfig, init_root, load_config
from invokeai.app.config.describe import SETTINGS, is_common
from invokeai.app.config.migrations import CURRENT_SCHEMA_VERSION


def test_first_start_creates_root_and_commented_file(tmp_path: Path) -> None:
    root = tmp_path / "new" / "root"
    config = load_config(CliArgs(root=root)).config
    assert not root.exists()  # loading alone writes nothing

    assert init_root(config) is True
    text = (root / "invokeai.yaml").read_text()
    assert yaml.safe_load(text) == {"schema_version": CURRENT_SCHEMA_VERSION}
    for name in SETTINGS:
        assert (f"# {name}: " in text) == is_common(name), name
    assert "# attention_backend: auto" in text


def test_first_run_file_loads_back_to_defaults(tmp_path: Path) -> None:
    init_root(load_config(CliArgs(root=tmp_path)).config)
    reloaded = load_config(CliArgs(root=tmp_path)).config
    assert reloaded.model_dump() == InvokeAIAppConfig.model_validate({}).model_dump()


def test_uncommenting_a_line_sets_the_setting(tmp_path: Path) -> None:
    init_root(load_config(CliArgs(root=tmp_path)).config)
    path = tmp_path / "invokeai.yaml"
    path.write_text(path.read_text().replace("# attention_backend: auto", "attention_backend: math"))
    assert load_config(CliArgs(root=tmp_path)).config.attention_backend == "math"


def test_existing_file_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / "invokeai.yaml").write_text("port: 9100\n")
    assert init_root(load_config(CliArgs(root=tmp_path)).config) is False
    assert (tmp_path / "invokeai.yaml").read_text() == "port: 9100\n"
