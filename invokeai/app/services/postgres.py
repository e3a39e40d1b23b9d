"""The PostgreSQL engine: psycopg 3 connections from a pool, shared by every server that names the same database.

A transaction holds one pooled connection for its thread until it ends, so that everything the thread does inside
it (also through `execute()`) is part of it; outside a transaction each statement borrows a connection and commits.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from invokeai.app.services.database import Dialect
from invokeai.app.services.migrations import MIGRATIONS, Migration, run_migrations

logger = logging.getLogger(__name__)

# Any fixed 64-bit number: the advisory lock every InvokeAI server takes before it migrates a database.
_MIGRATION_LOCK = 0x496E766F6B6541
CONNECT_TIMEOUT_S = 10
# How long a statement waits for a pooled connection (all busy, or the database away) by default: short, so that
# during an outage an API request is answered 503 at once rather than after a long wait.
POOL_WAIT_S = 3.0


class DatabaseUnreachableError(RuntimeError):
    """The server named by database_url did not answer or refused the connection; the message says where and why
    (never the password)."""


# A `%` that does not start a %XX escape: libpq refuses the URL, quoting the part, password and all.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _url_parts(url: str) -> list[tuple[str, str]]:
    """(what, text) for each part of a postgresql:// URL, split as libpq splits it, however malformed the rest."""
    rest = url.split("://", 1)[1] if "://" in url else url
    rest, _, query = rest.partition("?")
    authority, _, dbname = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    if not at:
        userinfo, hostport = "", authority
    user, _, password = userinfo.partition(":")
    return [
        ("the user name", user),
        ("the password", password),
        ("the host and port", hostport),
        ("the database name", dbname),
        ("the query (after ?)", query),
    ]


def url_problem(url: str) -> str | None:
    """Why libpq cannot parse `url`, naming only the part that is wrong: never its text, the password or the URL
    (libpq's own message quotes them). None when it parses."""
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError as error:
        message = str(error)
    else:
        return None
    parts = _url_parts(url)
    for what, text in parts:
        if _BAD_ESCAPE.search(text):
            return (
                f"{what} has a '%' that does not start a %XX escape (write a literal '%' as %25 and other special "
                "characters percent-encoded)"
            )
    hostport = dict(parts)["the host and port"]
    if hostport.count("[") != hostport.count("]"):
        return "the host and port: an IPv6 address opened with '[' is not closed with ']'"
    if "query parameter" in message:
        # Not the parameter's name either: an unencoded '&' in a password puts part of it where a name would be.
        return "the query (after ?) has a parameter that PostgreSQL does not accept, or one without '='"
    return "it is not a URL that PostgreSQL can read (libpq's message is not shown: it may quote the password)"


class DatabaseUrlError(ValueError):
    """database_url cannot be parsed; the message names the part that is wrong (never the password or the URL)."""


def describe_url(url: str) -> str:
    """`database 'db' on host:port` (as libpq would default them): where a URL points, without its password."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the database that database_url names"
    return (
        f"database {parts.get('dbname') or parts.get('user') or '(default)'!r} on "
        f"{parts.get('host') or 'localhost'}:{parts.get('port') or 5432}"
    )


def check_reachable(url: str) -> None:
    """Connect once; raises DatabaseUnreachableError naming host, port and database and libpq's reason, or
    DatabaseUrlError for a URL that cannot be parsed."""
    problem = url_problem(url)
    if problem is not None:
        raise DatabaseUrlError(f"cannot be parsed: {problem}")
    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S):
            pass
    except psycopg.Error as error:
        reason = " ".join(str(error).split())
        raise DatabaseUnreachableError(f"cannot connect to PostgreSQL {describe_url(url)}: {reason}") from None


@lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """SQLite's placeholders in psycopg's syntax: `?` -> `%s`, `:name` -> `%(name)s`, a literal `%` -> `%%`.

    Text inside quotes (string literals, quoted names) is left as it is, and so is a `::` cast."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        char = sql[i]
        if char in "'\"":
            end = sql.find(char, i + 1)
            end = n - 1 if end < 0 else end
            out.append(sql[i : end + 1].replace("%", "%%"))
            i = end + 1
            continue
        if char == "?":
            out.append("%s")
        elif char == "%":
            out.append("%%")
        elif char == ":" and i + 1 < n and sql[i + 1] == ":":
            out.append("::")
            i += 2
            continue
        elif char == ":" and i + 1 < n and (sql[i + 1].isalpha() or sql[i + 1] == "_"):
            j = i + 1
            while j < n and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            out.append(f"%({sql[i + 1 : j]})s")
            i = j
            continue
        else:
            out.append(char)
        i += 1
    return "".join(out)


class Row(tuple[Any, ...]):
    """A row readable as sqlite3.Row is: by index and by column name."""

    _names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row._names = names
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    names = {column.name: index for index, column in enumerate(cursor.description or ())}
    return lambda values: Row(values, names)


def _params(params: Sequence[Any] | dict[str, Any]) -> Sequence[Any] | dict[str, Any]:
    return params if isinstance(params, dict) else tuple(params)


class PostgresCursor:
    """A psycopg cursor that takes the services' SQL (see `translate`)."""

    dialect: Dialect = "postgresql"

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> PostgresCursor:
        self._cursor.execute(translate(sql), _params(params))  # type: ignore[arg-type]
        return self

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        self._cursor.executemany(translate(sql), [tuple(row) for row in params])  # type: ignore[arg-type]

    def fetchone(self) -> Row | None:
        return self._cursor.fetchone() if self._cursor.description else None

    def fetchall(self) -> list[Row]:
        return self._cursor.fetchall() if self._cursor.description else []


class PostgresDatabase:
    """The services' database on a PostgreSQL server (database_url); a pool of at most `pool_size` connections."""

    dialect: Dialect = "postgresql"

    def __init__(
        self,
        url: str,
        pool_size: int,
        migrations: Sequence[Migration] | None = None,
        *,
        wait_s: float | None = None,
    ) -> None:
        """wait_s: how long a statement waits for a pooled connection (all busy, or the database away) before it
        fails with PoolTimeout (a psycopg.OperationalError, as a lost connection is); POOL_WAIT_S by default."""
        self.url = url
        self.where = describe_url(url)
        check_reachable(url)
        self._local = threading.local()
        self._pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "row_factory": _row_factory, "connect_timeout": CONNECT_TIMEOUT_S},
            open=False,
            name="invokeai",
            timeout=POOL_WAIT_S if wait_s is None else wait_s,
            # Each connection is checked (one round trip) before it is handed out: after a restart of the database
            # the pool's idle connections are dead, and without the check the next few statements failed on them
            # (2-3 lease renewals in a row: a whole short lease, and live servers' items swept).
            check=ConnectionPool.check_connection,
        )
        self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
        logger.info("Database: PostgreSQL %s, at most %d connections", self.where, pool_size)
        try:
            run_migrations(self, MIGRATIONS if migrations is None else migrations)
        except BaseException:
            self._pool.close()
            raise

    def _held(self) -> psycopg.Connection[Row] | None:
        return getattr(self._local, "conn", None)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Row]]:
        """This thread's connection for a transaction, held (and the pool's slot taken) until it ends."""
        with self._pool.connection() as conn:
            self._local.conn = conn
            try:
                yield conn
            finally:
                self._local.conn = None

    @contextmanager
    def transaction(self) -> Iterator[PostgresCursor]:
        """BEGIN ... COMMIT on this thread's connection; nested, a savepoint (psycopg's transaction() nests so)."""
        held = self._held()
        if held is not None:
            with held.transaction(), held.cursor() as cursor:
                yield PostgresCursor(cursor)
            return
        with self._connection() as conn, conn.transaction(), conn.cursor() as cursor:
            yield PostgresCursor(cursor)

    @contextmanager
    def read_transaction(self) -> Iterator[None]:
        """One snapshot for several reads (REPEATABLE READ, READ ONLY): a count and a page agree."""
        if self._held() is not None:
            yield
            return
        with self._connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Row]:
        held = self._held()
        if held is not None:
            with held.cursor() as cursor:
                return PostgresCursor(cursor).execute(sql, params).fetchall()
        with self._pool.connection() as conn, conn.cursor() as cursor:
            return PostgresCursor(cursor).execute(sql, params).fetchall()

    def reclaim_space(self) -> None:
        """Nothing to do: PostgreSQL's autovacuum makes the space of deleted rows reusable."""

    @property
    def schema_version(self) -> int:
        rows = self.execute("SELECT COALESCE(MAX(version), 0) AS version FROM migrations")
        return int(rows[0]["version"])

    def lock_schema(self, cursor: Any) -> None:
        # Held to the end of the transaction: servers starting together on a fresh database migrate one at a time,
        # and each then finds the migration already recorded.
        cursor.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))

    def dedicated_connection(self) -> psycopg.Connection[Row]:
        """A connection of its own, outside the pool (autocommit, the same rows), for a long-lived use such as
        LISTEN, which must not hold one of the pool's; the caller closes it."""
        return psycopg.connect(self.url, autocommit=True, row_factory=_row_factory, connect_timeout=CONNECT_TIMEOUT_S)

    def close(self) -> None:
        self._pool.close()
