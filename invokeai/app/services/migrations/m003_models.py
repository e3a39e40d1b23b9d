"""Migration 3: the model records (one row per installed model)."""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration


def _apply(cursor: Cursor) -> None:
    # Names are what users type in graphs; NOCASE keeps "Demo" and "demo" from both existing, which would also
    # collide as folder names on case-insensitive filesystems.
    # owned: the server put the files there (copied or built them), so deleting the record deletes them too;
    # a model registered in place belongs to the user and its files are left alone.
    # PostgreSQL has no NOCASE: a unique index on lower(name) does the same (names are ASCII, see model_records),
    # and the services look names up by lower(name) on both engines. size: models pass 2 GiB, PostgreSQL's INTEGER.
    postgres = cursor.dialect == "postgresql"
    name = "name TEXT NOT NULL" if postgres else "name TEXT NOT NULL UNIQUE COLLATE NOCASE"
    size = "BIGINT" if postgres else "INTEGER"
    cursor.execute(
        f"""
        CREATE TABLE models (
            key TEXT PRIMARY KEY,
            {name},
            family TEXT NOT NULL,
            type TEXT NOT NULL,
            format TEXT NOT NULL,
            path TEXT NOT NULL,
            size {size} NOT NULL,
            hash TEXT,
            source TEXT NOT NULL,
            description TEXT,
            config_variant TEXT,
            owned INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """
    )
    if postgres:
        cursor.execute("CREATE UNIQUE INDEX models_name_lower ON models (lower(name))")
    cursor.execute("CREATE INDEX models_family_type ON models (family, type)")


migration = Migration(version=3, description="models", apply=_apply)
