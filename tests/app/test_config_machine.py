"""Settings this machine cannot honour (a device it lacks, a db_path that cannot hold a database) stop the start
with exit code 2 and one line each, before the server is built; they used to fail inside the server's startup,
with a traceback and uvicorn's exit code 3."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from invokeai.app.config import CliArgs, ConfigError, load_config
from invokeai.app.config.machine import check_machine, database_problem
from invokeai.app.services.sqlite import SqliteDatabase

Run = Callable[..., subprocess.CompletedProcess[str]]

# Devices this machine lacks: Linux has no MPS, and CI machines no XPU; CUDA only where torch sees none.
ABSENT_DEVICES = [
    name
    for name, present in [
        ("cuda", torch.cuda.is_available()),
        ("cuda:7", torch.cuda.device_count() > 7),
        ("mps", torch.backends.mps.is_available()),
        ("xpu", hasattr(torch, "xpu") and torch.xpu.is_available()),
    ]
    if not present
]


def machine_problems(root: Path, yaml_text: str) -> list[str]:
    (root / "invokeai.yaml").write_text(yaml_text)
    loaded = load_config(CliArgs(root=root))
    with pytest.raises(ConfigError) as caught:
        check_machine(loaded)
    return caught.value.problems


@pytest.mark.parametrize("device", ABSENT_DEVICES)
def test_an_absent_device_is_refused(tmp_path: Path, device: str) -> None:
    [problem] = machine_problems(tmp_path, f"device: {device}\n")
    assert problem.startswith(f"{tmp_path / 'invokeai.yaml'}: 'device' is {device!r}; device {device!r} ")


def test_the_problem_names_the_source_of_the_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOKEAI_DEVICE", ABSENT_DEVICES[0])
    (tmp_path / "databases").write_text("in the way of the default db_path's folder")
    problems = machine_problems(tmp_path, "")
    assert problems == [
        f"environment variable INVOKEAI_DEVICE is {ABSENT_DEVICES[0]!r}; device {ABSENT_DEVICES[0]!r} is not "
        "available on this machine",
        f"'db_path' (its default) is 'databases/invokeai.db'; {tmp_path / 'databases'} is a file, not a folder",
    ]


def test_present_devices_and_a_fresh_db_path_pass(tmp_path: Path) -> None:
    for device in ["auto", "cpu", *(["cuda"] if torch.cuda.is_available() else [])]:
        (tmp_path / "invokeai.yaml").write_text(f"device: {device}\ndb_path: deep/er/invokeai.db\n")
        check_machine(load_config(CliArgs(root=tmp_path)))
    assert (tmp_path / "deep" / "er").is_dir()


def test_a_memory_database_needs_no_db_path(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "invokeai.yaml").write_text(f"use_memory_db: true\ndb_path: {tmp_path / 'a-file' / 'x.db'}\n")
    check_machine(load_config(CliArgs(root=tmp_path)))


def test_db_path_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    assert (
        database_problem(tmp_path / "a-file" / "deeper" / "invokeai.db")
        == f"{tmp_path / 'a-file'} is a file, not a folder"
    )


def test_db_path_that_is_a_folder(tmp_path: Path) -> None:
    assert database_problem(tmp_path) == f"{tmp_path} is a folder, not a file"


def test_db_path_that_is_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("these are my notes, not a database " * 100)
    problem = database_problem(tmp_path / "notes.txt")
    assert problem == f"{tmp_path / 'notes.txt'} cannot be opened as a SQLite database (file is not a database)"
    assert (tmp_path / "notes.txt").read_text().startswith("these are my notes")  # looked at, not touched


def test_an_existing_database_passes(tmp_path: Path) -> None:
    path = tmp_path / "invokeai.db"
    SqliteDatabase(path).close()
    assert database_problem(path) is None
    SqliteDatabase(path).close()  # and the server can still open it


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "read-only"
    folder.mkdir()
    sqlite3.connect(folder / "invokeai.db").close()
    folder.chmod(0o555)
    try:
        assert database_problem(folder / "invokeai.db") == f"{folder / 'invokeai.db'} or its folder is not writable"
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("case", ["device", "db_path under a file", "db_path a folder", "db_path not a database"])
def test_console_script_exits_2_without_traceback(tmp_path: Path, run_invokeai_web: Run, case: str) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a database")
    device = ABSENT_DEVICES[0]
    line, why = {
        "device": (f"device: {device}", f"device {device!r} is not available on this machine"),
        "db_path under a file": (f"db_path: {a_file / 'invokeai.db'}", f"{a_file} is a file, not a folder"),
        "db_path a folder": (f"db_path: {tmp_path}", f"{tmp_path} is a folder, not a file"),
        "db_path not a database": (
            f"db_path: {a_file}",
            f"{a_file} cannot be opened as a SQLite database (file is not a database)",
        ),
    }[case]
    root = tmp_path / "root"
    root.mkdir()
    (root / "invokeai.yaml").write_text(line + "\n")
    result = run_invokeai_web("--root", str(root), "--port", "0", env={"INVOKEAI_INSTALL_DEMO_MODELS": "false"})
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output and "Uvicorn running" not in output
    name, value = line.split(": ", 1)
    # The start's first log line comes before the check (which imports torch); the refusal is the last line.
    assert (
        result.stderr.splitlines()[-1] == f"invokeai-web: error: {root / 'invokeai.yaml'}: '{name}' is {value!r}; {why}"
    )
    assert a_file.read_text() == "not a database"


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_web_ui_naming_a_folder_without_index_html_stops_startup(tmp_path: Path, folder: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "invokeai.yaml").write_text(f"web_ui: invokeai:{folder}\n")
    loaded = load_config(CliArgs(root=tmp_path))
    assert loaded.config.web_ui_dir == tmp_path / folder
    with pytest.raises(ConfigError) as caught:
        check_machine(loaded)
    assert f"'web_ui' is 'invokeai:{folder}'; {tmp_path / folder} has no index.html" in str(caught.value)


@pytest.mark.parametrize("value", ["invokeai", "invokeai:", "comfyui:/x", "InvokeAI's"])
def test_web_ui_takes_builtin_or_invokeai_and_a_folder(tmp_path: Path, value: str) -> None:
    (tmp_path / "invokeai.yaml").write_text(f'web_ui: "{value}"\n')
    with pytest.raises(ConfigError, match="allowed: builtin, invokeai:<folder>"):
        load_config(CliArgs(root=tmp_path))
