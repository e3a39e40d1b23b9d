"""database_url and the queue's lease settings: what is accepted, what stops the start (exit 2), and that the
password is never shown."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from invokeai.app.config import CliArgs, ConfigError, load_config

Run = Callable[..., subprocess.CompletedProcess[str]]


def _load(root: Path, yaml_text: str) -> object:
    (root / "invokeai.yaml").write_text(yaml_text)
    return load_config(CliArgs(root=root, overrides={})).config


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://invoke:secret@db.example:5433/invokeai",
        "postgres://db.example/invokeai",
        "postgresql://invoke@10.0.0.5/queue?sslmode=require",
        "",
    ],
)
def test_postgresql_urls_and_empty_are_accepted(tmp_path: Path, url: str) -> None:
    config = _load(tmp_path, f"database_url: '{url}'\n")
    assert config.database_url == url  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "url", ["mysql://u@h/db", "sqlite:///tmp/x.db", "postgresql://h", "postgresql:/h/db", "db.example:5432"]
)
def test_another_scheme_or_no_database_is_refused_without_showing_the_value(tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, f"database_url: '{url}:pw-1234'\n")
    message = str(caught.value)
    assert "'database_url' is (hidden: a secret setting); allowed: postgresql://user[:password]@host" in message
    assert "pw-1234" not in message


def test_database_url_with_use_memory_db_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, "database_url: postgresql://u:pw-1234@h/db\nuse_memory_db: true\n")
    message = str(caught.value)
    assert "'database_url'" in message and "'use_memory_db'" in message and "are both set" in message
    assert "pw-1234" not in message


def test_lease_and_requeue_settings(tmp_path: Path) -> None:
    config = _load(tmp_path, "queue_lease_seconds: 12\nrequeue_interrupted: true\n")
    assert (config.queue_lease_seconds, config.requeue_interrupted) == (12, True)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="'queue_lease_seconds' is 1; expected an integer from 3 to 3600"):
        _load(tmp_path, "queue_lease_seconds: 1\n")


def test_a_server_that_cannot_reach_its_database_exits_2_naming_where_but_not_the_password(
    tmp_path: Path, run_invokeai_web: Run, free_port: int
) -> None:
    url = f"postgresql://invoke:pw-1234@127.0.0.1:{free_port}/studio"
    done = run_invokeai_web("--root", str(tmp_path), env={"INVOKEAI_DATABASE_URL": url})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "environment variable INVOKEAI_DATABASE_URL: cannot connect to PostgreSQL database 'studio' on " in (
        done.stderr
    )
    assert f"127.0.0.1:{free_port}" in done.stderr
    assert "pw-1234" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("postgresql://invoke:pw-12%zz34@127.0.0.1:5432/studio", "the password has a '%' that does not start"),
        ("postgresql://invoke:pw-1234@[::1:5432/studio", "the host and port: an IPv6 address opened with '['"),
        ("postgresql://invoke:pw-1234@127.0.0.1/stu%dio", "the database name has a '%'"),
        ("postgresql://invoke@127.0.0.1/studio?password=pw-12%zz34", "the query (after ?) has a '%'"),
        ("postgresql://invoke@127.0.0.1/studio?password=pw-12&34=x", "the query (after ?) has a parameter"),
    ],
)
def test_a_database_url_that_cannot_be_parsed_names_the_part_without_its_text(url: str, names: str) -> None:
    # libpq's own message quotes the part it could not read (the password with a bare %) or the whole URL.
    from invokeai.app.config.machine import postgres_problem

    problem = postgres_problem(url)
    assert problem is not None and problem.startswith(f"cannot be parsed: {names}"), problem
    for secret in ("pw-12", "1234", "zz34", "studio", "invoke", "127.0.0.1", "::1"):
        assert secret not in problem


def test_a_server_whose_database_url_cannot_be_parsed_exits_2_without_the_password(
    tmp_path: Path, run_invokeai_web: Run
) -> None:
    done = run_invokeai_web(
        "--root", str(tmp_path), env={"INVOKEAI_DATABASE_URL": "postgresql://invoke:pw-12%zz34@127.0.0.1/studio"}
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "environment variable INVOKEAI_DATABASE_URL: cannot be parsed: the password has a '%'" in done.stderr
    assert "pw-12" not in done.stderr + done.stdout and "127.0.0.1" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
