"""Migration 9: what InvokeAI's model records carry that a model's files do not say: where it came from
(`source_type`), its trigger phrases and its default settings."""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration


def _apply(cursor: Cursor) -> None:
    # Every model so far was installed from a path on the server (InvokeAI's source_type "path").
    cursor.execute("ALTER TABLE models ADD COLUMN source_type TEXT NOT NULL DEFAULT 'path'")
    # JSON text, null where the user set none: a list of phrases, and an object of MainModelDefaultSettings fields
    # (a record with none shows its family's defaults).
    cursor.execute("ALTER TABLE models ADD COLUMN trigger_phrases TEXT")
    cursor.execute("ALTER TABLE models ADD COLUMN default_settings TEXT")


migration = Migration(version=9, description="model source type, trigger phrases and default settings", apply=_apply)
