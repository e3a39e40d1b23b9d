"""Migration 1: the images table (one row per PNG under outputs_dir)."""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration


def _apply(cursor: Cursor) -> None:
    # Listing breaks ties between images stored within one clock tick by insertion order: SQLite's implicit rowid;
    # PostgreSQL has none, so there it is a column of that name.
    rowid = "rowid BIGINT GENERATED ALWAYS AS IDENTITY," if cursor.dialect == "postgresql" else ""
    cursor.execute(
        f"""
        CREATE TABLE images ({rowid}
            image_name TEXT PRIMARY KEY,
            width INTEGER NOT NULL,
            height INTEGER NOT NULL,
            origin TEXT NOT NULL CHECK (origin IN ('generated', 'uploaded')),
            session_id TEXT,
            node_id TEXT,
            metadata TEXT,
            created_at TEXT NOT NULL
        )
        """
    )
    # Listing is newest first; rowid breaks ties between images made within the same clock tick.
    cursor.execute("CREATE INDEX images_created_at ON images (created_at DESC)")
    cursor.execute("CREATE INDEX images_session_id ON images (session_id)")


migration = Migration(version=1, description="images", apply=_apply)
