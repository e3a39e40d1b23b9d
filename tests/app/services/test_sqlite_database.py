"""SqliteDatabase and the numbered migrations: fresh databases, reopening, in memory, transactions."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from invokeai.app.services.migrations import MIGRATIONS, Migration, MigrationError
from invokeai.app.services.sqlite import SqliteDatabase


def _tables(db: SqliteDatabase) -> set[str]:
    return {row["name"] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_migration_versions_are_consecutive_from_one() -> None:
    assert [migration.version for migration in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert MIGRATIONS[0].description == "images"


def test_a_fresh_file_database_gets_every_migration(tmp_path: Path) -> None:
    path = tmp_path / "databases" / "invokeai.db"
    db = SqliteDatabase(path)
    assert path.is_file()
    assert db.schema_version == len(MIGRATIONS)
    assert {"migrations", "images"} <= _tables(db)
    rows = db.execute("SELECT version, description FROM migrations ORDER BY version")
    assert [(row["version"], row["description"]) for row in rows] == [(m.version, m.description) for m in MIGRATIONS]
    assert db.execute("PRAGMA journal_mode")[0][0] == "wal"
    assert db.execute("PRAGMA synchronous")[0][0] == 1  # NORMAL: no fsync per commit, consistent after a crash
    assert db.execute("PRAGMA foreign_keys")[0][0] == 1
    db.close()


def test_reopening_a_file_database_does_not_run_migrations_again(tmp_path: Path) -> None:
    path = tmp_path / "invokeai.db"
    calls: list[int] = []

    def counting(cursor: sqlite3.Cursor) -> None:
        calls.append(1)
        cursor.execute("CREATE TABLE counted (x INTEGER)")

    migrations = [*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "counted", counting)]
    db = SqliteDatabase(path, migrations)
    db.execute("INSERT INTO counted (x) VALUES (1)")
    db.close()
    again = SqliteDatabase(path, migrations)
    assert calls == [1]
    assert again.execute("SELECT x FROM counted")[0]["x"] == 1
    assert again.schema_version == len(migrations)
    again.close()


def test_a_new_migration_upgrades_an_existing_database(tmp_path: Path) -> None:
    path = tmp_path / "invokeai.db"
    SqliteDatabase(path, MIGRATIONS).close()
    added = Migration(len(MIGRATIONS) + 1, "extra", lambda cursor: cursor.execute("CREATE TABLE extra (x)"))
    db = SqliteDatabase(path, [*MIGRATIONS, added])
    assert db.schema_version == len(MIGRATIONS) + 1
    assert "extra" in _tables(db)
    db.close()


def test_in_memory_databases_are_separate() -> None:
    first, second = SqliteDatabase(None), SqliteDatabase(None)
    first.execute(
        "INSERT INTO images (image_name, width, height, origin, created_at) VALUES ('a', 1, 1, 'generated', 'now')"
    )
    assert first.execute("SELECT COUNT(*) FROM images")[0][0] == 1
    assert second.execute("SELECT COUNT(*) FROM images")[0][0] == 0
    assert second.schema_version == len(MIGRATIONS)


@pytest.mark.parametrize("versions", [[2], [1, 3], [1, 1]])
def test_migrations_that_are_not_consecutive_are_refused(versions: list[int]) -> None:
    migrations = [Migration(version, f"m{version}", lambda cursor: None) for version in versions]
    with pytest.raises(MigrationError, match="consecutive"):
        SqliteDatabase(None, migrations)


def test_a_failing_migration_leaves_the_database_at_the_previous_version(tmp_path: Path) -> None:
    path = tmp_path / "invokeai.db"

    def half_done(cursor: sqlite3.Cursor) -> None:
        cursor.execute("CREATE TABLE half (x)")
        raise RuntimeError("broken migration")

    with pytest.raises(RuntimeError, match="broken migration"):
        SqliteDatabase(path, [*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "half", half_done)])
    db = SqliteDatabase(path)
    assert db.schema_version == len(MIGRATIONS)
    assert "half" not in _tables(db)
    db.close()


def test_a_database_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "invokeai.db"
    SqliteDatabase(path, [*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "future", lambda cursor: None)]).close()
    with pytest.raises(MigrationError, match="newer than this InvokeAI knows"):
        SqliteDatabase(path)


def test_transaction_commits_or_rolls_back() -> None:
    db = SqliteDatabase(None)
    db.execute("CREATE TABLE t (x INTEGER)")
    with db.transaction() as cursor:
        cursor.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(ValueError), db.transaction() as cursor:
        cursor.execute("INSERT INTO t VALUES (2)")
        raise ValueError("undo")
    assert [row["x"] for row in db.execute("SELECT x FROM t")] == [1]


def test_a_nested_transaction_undoes_only_its_own_work() -> None:
    db = SqliteDatabase(None)
    db.execute("CREATE TABLE t (x INTEGER)")
    with db.transaction() as outer:
        outer.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(ValueError), db.transaction() as inner:
            inner.execute("INSERT INTO t VALUES (2)")
            raise ValueError("undo inner")
        with db.transaction() as inner:
            inner.execute("INSERT INTO t VALUES (3)")
    assert [row["x"] for row in db.execute("SELECT x FROM t ORDER BY x")] == [1, 3]


def test_threads_share_the_connection_safely(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path / "invokeai.db")
    db.execute("CREATE TABLE t (x INTEGER)")

    def write(start: int) -> None:
        for x in range(start, start + 50):
            with db.transaction() as cursor:
                cursor.execute("INSERT INTO t VALUES (?)", (x,))

    threads = [threading.Thread(target=write, args=(i * 100,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert db.execute("SELECT COUNT(*) FROM t")[0][0] == 200
    db.close()
