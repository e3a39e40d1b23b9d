"""Migration 10: the claim's token, a random value written when a worker claims an item (and cleared when the item is
put back as pending). Every write the run makes afterwards (its end, its lease, its images) names the token and is
refused once the item is no longer that claim's: a worker that was cut off past its lease and then resumed cannot
write over a rerun, even one on a worker of the same name.

A plain `ADD COLUMN`: the same statement runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration


def _apply(cursor: Cursor) -> None:
    cursor.execute("ALTER TABLE session_queue ADD COLUMN claim_token TEXT")


migration = Migration(version=10, description="queue item claim token", apply=_apply)
