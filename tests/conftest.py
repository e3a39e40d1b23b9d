"""Fixtures shared across test folders. torch is imported inside them, so tests that need none of it (the
configuration and API tests) do not pay for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from invokeai.backend.attention.testing import StandInDispatcher


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from threads, and on a shared 2-core machine OpenMP workers spin-waiting for a busy
    core made a 0.3 s generation take 10 s; one thread keeps these tests' time steady."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def dispatcher(monkeypatch: pytest.MonkeyPatch) -> Callable[..., StandInDispatcher]:
    """`dispatcher("FLASH_ATTENTION", ...)`: PyTorch's dispatcher replaced by one that serves only those kernels,
    walking the installed order and flags as a GPU's would; `dispatcher({"FLASH_ATTENTION": rule, ...})` gives a
    kernel a rule over the call (e.g. flash takes no mask)."""
    from invokeai.backend import devices
    from invokeai.backend.attention.testing import StandInDispatcher

    def make(*can_serve: Any) -> StandInDispatcher:
        rules = can_serve[0] if len(can_serve) == 1 and isinstance(can_serve[0], dict) else can_serve
        stand_in = StandInDispatcher(rules)
        monkeypatch.setattr(devices, "fused_sdp_choice", stand_in)
        monkeypatch.setattr(devices, "kernel_can_serve", stand_in.can_serve)
        return stand_in

    return make


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """The tests' PostgreSQL server (tests/postgres_support.py): a skip where this machine has none, unless
    INVOKEAI_TEST_POSTGRES_REQUIRED is set (as `.ci/run` sets it), where it is a failure."""
    import os

    from postgres_support import REQUIRED_ENV, PostgresUnavailable, PrivatePostgres

    try:
        with PrivatePostgres() as server:
            yield server
    except PostgresUnavailable as error:
        if os.environ.get(REQUIRED_ENV):
            raise
        pytest.skip(str(error))


@pytest.fixture
def postgres_url(postgres_server: Any) -> Iterator[str]:
    """A new, empty database on the tests' server, dropped after the test (with whatever still holds it open)."""
    import uuid

    import psycopg

    name = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield postgres_server.database_url(name)
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def faulty_postgres_server() -> Iterator[Any]:
    """A PostgreSQL server of this test session's own (tests/postgres_support.FaultyPostgres), which tests stop and
    restart: a skip where this machine has no PostgreSQL binaries, unless INVOKEAI_TEST_POSTGRES_REQUIRED is set."""
    import os

    from postgres_support import REQUIRED_ENV, FaultyPostgres, PostgresUnavailable

    try:
        server = FaultyPostgres()
    except PostgresUnavailable as error:
        if os.environ.get(REQUIRED_ENV):
            raise
        pytest.skip(str(error))
    yield server
    server.close()


@pytest.fixture
def faulty_postgres(faulty_postgres_server: Any) -> Iterator[Any]:
    """The fault server, running, with `url`: a new, empty database on it, dropped after the test. Whatever the test
    stopped is started again after it."""
    import uuid

    import psycopg
    from postgres_support import FaultyDatabase

    faulty_postgres_server.resume()
    name = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(faulty_postgres_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield FaultyDatabase(faulty_postgres_server, name)
    faulty_postgres_server.resume()
    with psycopg.connect(faulty_postgres_server.url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def invokeai_release(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """InvokeAI 6.14.2's built web UI and default workflows, fetched from PyPI once per test run
    (tests/invokeai_release.py)."""
    from invokeai_release import unpack_release

    return unpack_release(tmp_path_factory.mktemp("invokeai-6.14.2"))
