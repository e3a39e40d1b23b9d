"""One SQLite connection for the whole server, serialized by a lock, with its schema kept current by migrations."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from invokeai.app.services.database import Dialect
from invokeai.app.services.migrations import MIGRATIONS, Migration, run_migrations

_AUTO_VACUUM_INCREMENTAL = 2


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class SqliteCursor(sqlite3.Cursor):
    """A cursor that says which engine it is on, for the migrations whose DDL differs by engine."""

    dialect: Dialect = "sqlite"


class SqliteDatabase:
    """The embedded database: a file under the root, or memory when `path` is None (use_memory_db).

    A single connection shared by every thread keeps in-memory databases possible and write ordering simple;
    the reentrant lock serializes all use of it, so callers may nest `transaction()` inside their own locking.
    """

    dialect: Dialect = "sqlite"

    def __init__(self, path: Path | None, migrations: Sequence[Migration] | None = None) -> None:
        self.path = path
        self.lock = threading.RLock()
        self._savepoints = 0
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: the sqlite3 module opens no implicit transactions; `transaction()` says when.
        self._conn = sqlite3.connect(
            ":memory:" if path is None else str(path), check_same_thread=False, isolation_level=None, timeout=30
        )
        self._conn.row_factory = sqlite3.Row
        # A damaged byte in one text value must not make every query that reads it fail ("Could not decode to
        # UTF-8"): it reads back as U+FFFD, and the service that owns the value decides whether it still makes sense.
        self._conn.text_factory = _decode_text
        self._conn.execute("PRAGMA foreign_keys = ON")
        if path is not None:
            # INCREMENTAL: pages freed by a queue clear or prune can be handed back to the file system
            # (reclaim_space). Set before the first table on a new file; an older file is rebuilt once to take it.
            self._conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            if self._conn.execute("PRAGMA auto_vacuum").fetchone()[0] != _AUTO_VACUUM_INCREMENTAL:
                self._conn.execute("VACUUM")
            # WAL lets a reader (another process inspecting the file) proceed while the server writes. NORMAL
            # syncs the WAL at checkpoints instead of at every commit, as SQLite advises for WAL: the file stays
            # consistent after any crash, and only a power cut or OS crash can lose the last commits. FULL's fsync
            # per commit took 0.6 to 0.7 ms here, four times for every queue item (enqueue, dequeue, image, end).
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
        try:
            run_migrations(self, MIGRATIONS if migrations is None else migrations)
        except BaseException:
            self._conn.close()
            raise

    @contextmanager
    def transaction(self) -> Iterator[SqliteCursor]:
        """BEGIN IMMEDIATE ... COMMIT under the lock; any exception rolls everything back and propagates.

        Nested calls (same thread) become savepoints, so a service may call another's transactional method
        from inside its own transaction and an error in the inner one undoes only the inner work.
        """
        with self.lock:
            cursor = self._conn.cursor(SqliteCursor)
            try:
                if self._conn.in_transaction:
                    self._savepoints += 1
                    name = f"sp{self._savepoints}"
                    cursor.execute(f"SAVEPOINT {name}")
                    try:
                        yield cursor
                    except BaseException:
                        cursor.execute(f"ROLLBACK TO {name}")
                        cursor.execute(f"RELEASE {name}")
                        raise
                    else:
                        cursor.execute(f"RELEASE {name}")
                    finally:
                        self._savepoints -= 1
                    return
                # IMMEDIATE takes the write lock up front, so a transaction never fails half way for want of it.
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    yield cursor
                except BaseException:
                    self._conn.rollback()
                    raise
                else:
                    self._conn.commit()
            finally:
                cursor.close()

    @contextmanager
    def read_transaction(self) -> Iterator[None]:
        """Several reads that see one state: the lock keeps this server's writers out meanwhile, and a deferred
        transaction (taking no write lock) keeps other connections' commits out of the middle."""
        with self.lock:
            if self._conn.in_transaction:
                yield
                return
            self._conn.execute("BEGIN")
            try:
                yield
            finally:
                self._conn.commit()

    def lock_schema(self, cursor: sqlite3.Cursor) -> None:
        """Nothing to do: BEGIN IMMEDIATE already keeps any other connection from writing meanwhile."""

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        """Run one statement (committed at once) and return its rows."""
        with self.lock:
            cursor = self._conn.execute(sql, params)
            try:
                return cursor.fetchall()
            finally:
                cursor.close()

    def reclaim_space(self) -> None:
        """Give the pages that deleted rows left free back to the file system, and empty the WAL.

        Does nothing inside a transaction. The WAL is only truncated when no other connection is reading it; it is then
        emptied at a later checkpoint instead.
        """
        with self.lock:
            if self._conn.in_transaction:
                return  # executescript would commit the caller's transaction; the space is reclaimed next time
            # executescript steps the pragma to its end; execute() would free a single page.
            self._conn.executescript("PRAGMA incremental_vacuum")
            if self.path is not None:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    @property
    def schema_version(self) -> int:
        """The highest migration applied; 0 for a database no migration has touched."""
        rows = self.execute("SELECT COALESCE(MAX(version), 0) AS version FROM migrations")
        return int(rows[0]["version"])

    def close(self) -> None:
        with self.lock:
            self._conn.close()
