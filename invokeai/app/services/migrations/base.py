"""What a migration is, and how a database is brought up to the newest schema."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from invokeai.app.services.sqlite import SqliteDatabase


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[sqlite3.Cursor], None]


class MigrationError(RuntimeError):
    pass


def check_versions(migrations: Sequence[Migration]) -> None:
    """Versions must run 1, 2, 3, ...: a gap or a duplicate means a migration was lost or numbered twice."""
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise MigrationError(
                f"migration {migration.description!r} has version {migration.version}, expected {expected}: "
                "versions must be consecutive from 1"
            )


_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS migrations (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


def run_migrations(db: SqliteDatabase, migrations: Sequence[Migration]) -> None:
    """Apply, in order, every migration newer than the database; each in its own transaction with its record."""
    check_versions(migrations)
    with db.transaction() as cursor:
        cursor.execute(_CREATE_TABLE)
    current = db.schema_version
    if current > len(migrations):
        raise MigrationError(
            f"the database has schema version {current}, newer than this InvokeAI knows ({len(migrations)}); "
            "upgrade InvokeAI or use another database"
        )
    for migration in migrations[current:]:
        with db.transaction() as cursor:
            migration.apply(cursor)
            cursor.execute(
                "INSERT INTO migrations (version, description, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.description, datetime.now(UTC).isoformat()),
            )
