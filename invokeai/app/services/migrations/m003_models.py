"""Migration 3: the model records (one row per installed model)."""

from __future__ import annotations

import sqlite3

from invokeai.app.services.migrations.base import Migration


def _apply(cursor: sqlite3.Cursor) -> None:
    # Names are what users type in graphs; NOCASE keeps "Demo" and "demo" from both existing, which would also
    # collide as folder names on case-insensitive filesystems.
    # owned: the server put the files there (copied or built them), so deleting the record deletes them too;
    # a model registered in place belongs to the user and its files are left alone.
    cursor.execute(
        """
        CREATE TABLE models (
            key TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE COLLATE NOCASE,
            family TEXT NOT NULL,
            type TEXT NOT NULL,
            format TEXT NOT NULL,
            path TEXT NOT NULL,
            size INTEGER NOT NULL,
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
    cursor.execute("CREATE INDEX models_family_type ON models (family, type)")


migration = Migration(version=3, description="models", apply=_apply)
