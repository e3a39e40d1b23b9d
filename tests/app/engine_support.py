"""`@pytest.mark.parametrize("db", ENGINES, indirect=True)` runs a test on each database engine (the `db` fixture of
tests/app/conftest.py): the same service code and SQL on both. The PostgreSQL case skips where this machine has no
PostgreSQL, unless INVOKEAI_TEST_POSTGRES_REQUIRED is set (see tests/postgres_support.py)."""

from __future__ import annotations

ENGINES = ["sqlite", "postgresql"]
