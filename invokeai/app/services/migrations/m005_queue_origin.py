"""Migration 5: a queue item's `origin` and `destination`, as InvokeAI's clients send them with a batch."""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration


def _apply(cursor: Cursor) -> None:
    # Free text the client chooses, kept and returned as it was sent; items from before have none.
    cursor.execute("ALTER TABLE session_queue ADD COLUMN origin TEXT")
    cursor.execute("ALTER TABLE session_queue ADD COLUMN destination TEXT")


migration = Migration(version=5, description="queue item origin and destination", apply=_apply)
