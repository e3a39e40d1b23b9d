"""The database the services share, whichever engine holds it: what they may call, and which engine the settings
choose (the embedded SQLite file, or PostgreSQL when `database_url` is set).

Services write their SQL once, with qmark (`?`) or named (`:name`) placeholders; the PostgreSQL engine translates
them. Where the engines really differ, a service asks `db.dialect` for one of the small fragments below.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

import psycopg

if TYPE_CHECKING:
    from invokeai.app.config import InvokeAIAppConfig

Dialect = Literal["sqlite", "postgresql"]

# A unique or foreign-key constraint refused the statement, on either engine.
IntegrityError = (sqlite3.IntegrityError, psycopg.IntegrityError)


class Row(Protocol):
    """A result row, readable by column name and by index (sqlite3.Row, or the PostgreSQL engine's rows)."""

    def __getitem__(self, key: int | str, /) -> Any: ...

    def keys(self) -> list[str]: ...


class Cursor(Protocol):
    """What a transaction hands out: sqlite3.Cursor's subset that the services use, and the engine it is on."""

    dialect: Dialect

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, params: Sequence[Sequence[Any]], /) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Database(Protocol):
    """The interface both engines offer (SqliteDatabase, PostgresDatabase)."""

    dialect: Dialect

    def transaction(self) -> AbstractContextManager[Cursor]:
        """One read-write transaction; nested calls (same thread) are savepoints that undo only their own work."""
        ...

    def read_transaction(self) -> AbstractContextManager[None]:
        """Several reads that see one consistent state (inside a transaction: that transaction's)."""
        ...

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ...) -> list[Any]:
        """One statement, committed at once (inside this thread's transaction: part of it), and its rows."""
        ...

    def reclaim_space(self) -> None: ...

    @property
    def schema_version(self) -> int: ...

    def lock_schema(self, cursor: Cursor) -> None:
        """Called first in each migration's transaction: no other server migrates the same database meanwhile."""
        ...

    def close(self) -> None: ...


def skip_locked(dialect: Dialect) -> str:
    """Appended to the claim's SELECT: on PostgreSQL a row another server is claiming is skipped, not waited for,
    and the row this one picks stays locked until its claim commits. SQLite's single writer needs nothing."""
    return "FOR UPDATE SKIP LOCKED" if dialect == "postgresql" else ""


def for_share(dialect: Dialect) -> str:
    """Appended to a SELECT inside a transaction: on PostgreSQL the rows read cannot change (an UPDATE waits) until
    it ends. SQLite's single writer needs nothing."""
    return "FOR SHARE" if dialect == "postgresql" else ""


def advisory_lock(dialect: Dialect) -> str | None:
    """A statement with one `?` (a 64-bit key) that, inside a transaction, waits for and holds until its end a lock
    every server on the database shares; None on SQLite, whose BEGIN IMMEDIATE already admits one writer at a
    time."""
    return "SELECT pg_advisory_xact_lock(?)" if dialect == "postgresql" else None


# The database's own clock, as the services write times (ISO 8601, UTC, to the microsecond: see timestamps.py), so
# that a stored time compares with it as text. Leases are written and compared in it: with several servers on one
# PostgreSQL, each host's clock may be off by any amount, and only the database's is the same for all of them.
# SQLite's %f has milliseconds; the zeros keep the width (and so the text order) of now_iso's microseconds.
_NOW = {
    "sqlite": "strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000+00:00'",
    "postgresql": "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') || '+00:00'",
}
_IN = {
    "sqlite": "strftime('%Y-%m-%dT%H:%M:%f', 'now', CAST(? AS TEXT) || ' seconds') || '000+00:00'",
    "postgresql": "to_char(now() AT TIME ZONE 'UTC' + make_interval(secs => CAST(? AS DOUBLE PRECISION)), "
    "'YYYY-MM-DD\"T\"HH24:MI:SS.US') || '+00:00'",
}


def database_now(dialect: Dialect) -> str:
    """An SQL expression: now in the database's clock, as a stored time."""
    return _NOW[dialect]


def database_time_in(dialect: Dialect) -> str:
    """An SQL expression with one `?` (seconds): that long after now in the database's clock, as a stored time."""
    return _IN[dialect]


def open_database(config: InvokeAIAppConfig) -> Database:
    """The database the settings name, created or upgraded by the migrations."""
    if config.database_url:
        from invokeai.app.services.postgres import PostgresDatabase

        return PostgresDatabase(config.database_url, config.database_pool_size)
    from invokeai.app.services.sqlite import SqliteDatabase

    return SqliteDatabase(None if config.use_memory_db else config.db_file)
