"""PostgresDatabase on a real PostgreSQL server: transactions, savepoints, placeholders, rows, and the numbered
migrations, also with several processes opening one new database at once."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from claim_support import open_database

from invokeai.app.services.migrations import MIGRATIONS
from invokeai.app.services.postgres import PostgresDatabase, translate
from invokeai.app.services.sqlite import SqliteDatabase


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresDatabase]:
    database = PostgresDatabase(postgres_url, pool_size=4)
    database.execute("CREATE TABLE things (id INTEGER PRIMARY KEY, label TEXT)")
    yield database
    database.close()


def _labels(db: PostgresDatabase) -> list[str]:
    return [row["label"] for row in db.execute("SELECT label FROM things ORDER BY id")]


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT * FROM t WHERE a = ? AND b = ?", "SELECT * FROM t WHERE a = %s AND b = %s"),
        ("UPDATE t SET a = :a WHERE key = :key", "UPDATE t SET a = %(a)s WHERE key = %(key)s"),
        ("SELECT 5 % 3, x::text", "SELECT 5 %% 3, x::text"),
        ("SELECT 'a ? :b %' FROM t WHERE c LIKE ?", "SELECT 'a ? :b %%' FROM t WHERE c LIKE %s"),
        ('SELECT "odd?name" FROM t', 'SELECT "odd?name" FROM t'),
    ],
)
def test_placeholders_are_translated_outside_quotes(sql: str, expected: str) -> None:
    assert translate(sql) == expected


def test_statements_take_qmark_and_named_parameters_and_rows_read_by_name_and_index(pg: PostgresDatabase) -> None:
    pg.execute("INSERT INTO things (id, label) VALUES (?, ?)", (1, "50% off?"))
    pg.execute("INSERT INTO things (id, label) VALUES (:id, :label)", {"id": 2, "label": "it's :here"})
    rows = pg.execute("SELECT id, label, 7 % 4 AS rest FROM things WHERE label LIKE '%?%' OR id = ?", (2,))
    assert [(row["id"], row[1], row["rest"]) for row in rows] == [(1, "50% off?", 3), (2, "it's :here", 3)]
    assert rows[0].keys() == ["id", "label", "rest"]


def test_a_transaction_commits_or_rolls_back_everything(pg: PostgresDatabase) -> None:
    with pg.transaction() as cursor:
        cursor.execute("INSERT INTO things (id, label) VALUES (?, ?)", (1, "kept"))
        # execute() inside the thread's transaction is part of it: it sees the uncommitted row.
        assert pg.execute("SELECT COUNT(*) FROM things")[0][0] == 1
    with pytest.raises(RuntimeError), pg.transaction() as cursor:
        cursor.execute("INSERT INTO things (id, label) VALUES (?, ?)", (2, "undone"))
        raise RuntimeError("boom")
    assert _labels(pg) == ["kept"]


def test_a_nested_transaction_is_a_savepoint_that_undoes_only_its_own_work(pg: PostgresDatabase) -> None:
    with pg.transaction() as outer:
        outer.execute("INSERT INTO things (id, label) VALUES (1, 'outer')")
        with pytest.raises(psycopg.IntegrityError), pg.transaction() as inner:
            inner.execute("INSERT INTO things (id, label) VALUES (2, 'inner')")
            inner.execute("INSERT INTO things (id, label) VALUES (1, 'duplicate')")
        outer.execute("INSERT INTO things (id, label) VALUES (3, 'after')")
    assert _labels(pg) == ["outer", "after"]


def test_other_threads_do_not_see_a_transaction_before_it_commits(pg: PostgresDatabase) -> None:
    seen: list[int] = []
    with pg.transaction() as cursor:
        cursor.execute("INSERT INTO things (id, label) VALUES (1, 'x')")
        reader = threading.Thread(target=lambda: seen.append(pg.execute("SELECT COUNT(*) FROM things")[0][0]))
        reader.start()
        reader.join()
    assert seen == [0]
    assert pg.execute("SELECT COUNT(*) FROM things")[0][0] == 1


def test_a_read_transaction_sees_one_snapshot(pg: PostgresDatabase) -> None:
    with pg.read_transaction():
        before = pg.execute("SELECT COUNT(*) FROM things")[0][0]
        writer = threading.Thread(target=lambda: pg.execute("INSERT INTO things (id, label) VALUES (1, 'x')"))
        writer.start()
        writer.join()
        assert pg.execute("SELECT COUNT(*) FROM things")[0][0] == before == 0
    assert pg.execute("SELECT COUNT(*) FROM things")[0][0] == 1


def test_reclaim_space_is_harmless_in_and_out_of_a_transaction(pg: PostgresDatabase) -> None:
    pg.reclaim_space()
    with pg.transaction():
        pg.reclaim_space()


def _columns_sqlite(db: SqliteDatabase) -> dict[str, set[str]]:
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: {r["name"] for r in db.execute(f"PRAGMA table_info({t})")} for t in tables if t != "sqlite_sequence"}


def test_a_fresh_database_gets_the_same_tables_and_columns_as_sqlite(postgres_url: str) -> None:
    pg = PostgresDatabase(postgres_url, pool_size=2)
    rows = pg.execute("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public'")
    columns: dict[str, set[str]] = {}
    for row in rows:
        columns.setdefault(row["table_name"], set()).add(row["column_name"])
    expected = _columns_sqlite(SqliteDatabase(None))
    expected["images"].add("rowid")  # SQLite's is implicit (see migration 1)
    assert columns == expected
    assert pg.schema_version == len(MIGRATIONS)
    pg.close()
    again = PostgresDatabase(postgres_url, pool_size=2)  # reopening applies nothing twice
    assert [r[0] for r in again.execute("SELECT version FROM migrations ORDER BY version")] == list(
        range(1, len(MIGRATIONS) + 1)
    )
    again.close()


def test_model_names_are_unique_case_insensitively_in_the_schema(postgres_url: str) -> None:
    pg = PostgresDatabase(postgres_url, pool_size=2)
    insert = (
        "INSERT INTO models (key, name, family, type, format, path, size, source, created_at, updated_at) "
        "VALUES (?, ?, 'sd-1', 'main', 'diffusers', '/m', ?, '/m', 't', 't')"
    )
    pg.execute(insert, ("a", "Demo", 5 * 2**30))  # sizes past 2 GiB fit
    with pytest.raises(psycopg.IntegrityError):
        pg.execute(insert, ("b", "dEMO", 1))
    pg.close()


def test_servers_starting_together_on_a_new_database_apply_each_migration_once(postgres_url: str) -> None:
    start_at = time.time() + 3.0  # after every process has started and imported
    with multiprocessing.get_context("spawn").Pool(4) as processes:
        versions = processes.starmap(open_database, [(postgres_url, start_at)] * 4)
    assert versions == [len(MIGRATIONS)] * 4
    with psycopg.connect(postgres_url) as conn:
        applied = [row[0] for row in conn.execute("SELECT version FROM migrations ORDER BY version")]
    assert applied == list(range(1, len(MIGRATIONS) + 1))


def test_the_sqlite_engine_offers_the_same_interface(tmp_path: object) -> None:
    db = SqliteDatabase(None)
    with db.transaction() as cursor:
        assert cursor.dialect == db.dialect == "sqlite"
        with db.read_transaction():
            assert db.execute("SELECT COUNT(*) FROM images")[0][0] == 0
    with db.read_transaction():
        assert isinstance(db.execute("SELECT 1")[0], sqlite3.Row)
    db.close()


def test_a_dedicated_connection_is_outside_the_pool_and_hears_notifications(pg: PostgresDatabase) -> None:
    with pg.dedicated_connection() as listener:
        listener.execute("LISTEN invokeai_test")
        pg.execute("SELECT pg_notify('invokeai_test', ?)", ("hello",))
        heard = [note.payload for note in listener.notifies(timeout=5, stop_after=1)]
    assert heard == ["hello"]


def test_a_pooled_connection_that_a_restart_broke_is_replaced_before_use(faulty_postgres: Any) -> None:
    # After a restart, the pool's idle connections are dead: each is checked before it is handed out, so the first
    # statement after the restart succeeds instead of failing on a dead connection (2-3 failed lease renewals in a
    # row, a whole short lease, before the check).
    db = PostgresDatabase(faulty_postgres.url, pool_size=3)
    try:
        db.execute("SELECT 1")  # a connection in the pool, idle after this
        faulty_postgres.restart()
        for _ in range(3):
            assert db.execute("SELECT 1 AS one")[0]["one"] == 1
    finally:
        db.close()
