"""Migration 11: which queue item's run wrote an image, and whether that run did not complete.

A run writes its images before its item ends. When the item then fails, is canceled, or is interrupted (its server
stopped or was cut off past its lease, and the item was canceled or put back for a rerun), its images are marked
in the same transaction as the item's status change: the gallery's lists leave them out unless asked, and the
queue's prune removes them with their files. Images from before this migration were all listed, and stay so.

Plain `ADD COLUMN`s and an index: the same statements run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration


def _apply(cursor: Cursor) -> None:
    cursor.execute("ALTER TABLE images ADD COLUMN queue_item_id BIGINT")
    cursor.execute("ALTER TABLE images ADD COLUMN of_incomplete_run BOOLEAN NOT NULL DEFAULT FALSE")
    # The status change marks an item's images by its id; prune finds the marked ones.
    cursor.execute("CREATE INDEX images_queue_item_id ON images (queue_item_id)")


migration = Migration(version=11, description="image queue item and incomplete run flag", apply=_apply)
