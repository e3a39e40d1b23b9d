"""Fixtures for the app tests: an environment without INVOKEAI_* variables, an in-memory database, and the real
console script."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from invokeai.app.services.database import Database
from invokeai.app.services.sqlite import SqliteDatabase


def _is_invokeai_var(name: str) -> bool:
    return name.upper().startswith("INVOKEAI_")


@pytest.fixture(autouse=True)
def no_invokeai_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The developer's own INVOKEAI_* variables and ~/invokeai must not change any result."""
    for name in [name for name in os.environ if _is_invokeai_var(name)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    """A fresh database with every migration applied: in memory, or (parametrized "postgresql", see
    engine_support.ENGINES) a new, empty PostgreSQL database."""
    engine = getattr(request, "param", "sqlite")
    if engine == "postgresql":
        from invokeai.app.services.postgres import PostgresDatabase

        database: Database = PostgresDatabase(request.getfixturevalue("postgres_url"), pool_size=8)
    else:
        database = SqliteDatabase(None)
    yield database
    database.close()


def _child_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not _is_invokeai_var(name)}
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture
def child_env() -> Callable[..., dict[str, str]]:
    """child_env(NAME=value, ...): an environment for a subprocess, without the caller's INVOKEAI_* variables."""
    return _child_env


@pytest.fixture
def invokeai_web() -> str:
    """The installed console script (pip install -e '.[test]' puts it next to the interpreter)."""
    beside = Path(sys.executable).with_name("invokeai-web")
    found = str(beside) if beside.exists() else shutil.which("invokeai-web")
    if found is None:
        pytest.fail("invokeai-web is not installed: run pip install -e '.[test]'")
    return found


@pytest.fixture
def run_invokeai_web(invokeai_web: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the console script to completion (for runs that should stop before serving)."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [invokeai_web, *args], capture_output=True, text=True, timeout=60, env=_child_env(**(env or {}))
        )

    return run


@pytest.fixture
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def scripted_integer_node(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The built-in `integer` node made scriptable through its value (the graph's node union is fixed at import,
    so tests change what a registered node does instead of registering new ones):

    value 0: returns at once; value n > 0: n steps of 10 ms, each reported with context.progress (the first with
    a preview image), so a cancel stops it part way; value < 0: raises RuntimeError.
    Returns the list of attention caller names seen inside the node, one per run.
    """
    from PIL import Image

    from invokeai.app.nodes.base import InvocationContext
    from invokeai.app.nodes.primitives import IntegerInvocation, IntegerOutput
    from invokeai.backend.attention import current_node_type

    callers: list[str] = []

    def invoke(self: IntegerInvocation, context: InvocationContext) -> IntegerOutput:
        callers.append(current_node_type())
        if self.value < 0:
            raise RuntimeError(f"failed on purpose with value {self.value}")
        for step in range(1, self.value + 1):
            time.sleep(0.01)
            context.progress(step, self.value, (lambda: Image.new("RGB", (600, 300), "blue")) if step == 1 else None)
        return IntegerOutput(value=self.value)

    # Read from the real invoke's annotation now: this stand-in's names are local, so reading it would fail.
    IntegerInvocation.output_class()
    monkeypatch.setattr(IntegerInvocation, "invoke", invoke)
    return callers
