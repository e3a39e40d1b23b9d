"""Migration 2: the session queue (one row per graph run, with its status, timestamps, error and results)."""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration, never_reused_id


def _apply(cursor: Cursor) -> None:
    # never_reused_id: an item id is never reused after a prune or clear, so a client holding an old id can never
    # be answered with somebody else's item.
    cursor.execute(
        f"""
        CREATE TABLE session_queue (
            item_id {never_reused_id(cursor)},
            queue_id TEXT NOT NULL,
            batch_id TEXT NOT NULL,
            session_id TEXT NOT NULL UNIQUE,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'in_progress', 'completed', 'failed', 'canceled')),
            priority INTEGER NOT NULL DEFAULT 0,
            field_values TEXT,
            graph TEXT NOT NULL,
            results TEXT,
            error_type TEXT,
            error_message TEXT,
            error_traceback TEXT,
            cancel_reason TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            started_at TEXT,
            completed_at TEXT
        )
        """
    )
    # The worker's question, "which pending item is next", is answered from this index alone.
    cursor.execute("CREATE INDEX session_queue_next ON session_queue (status, priority DESC, item_id)")
    cursor.execute("CREATE INDEX session_queue_queue_status ON session_queue (queue_id, status)")
    cursor.execute("CREATE INDEX session_queue_batch ON session_queue (batch_id)")


migration = Migration(version=2, description="session queue", apply=_apply)
