"""Migration 7: what InvokeAI's clients keep with an image: its category, whether it is intermediate (a step of a
graph, kept out of the gallery), and the workflow and graph it was made with; and the workflow sent with a batch."""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration


def _apply(cursor: Cursor) -> None:
    # Images from before were all shown in the gallery, as generated or uploaded images of the general category.
    cursor.execute("ALTER TABLE images ADD COLUMN image_category TEXT NOT NULL DEFAULT 'general'")
    cursor.execute("ALTER TABLE images ADD COLUMN is_intermediate BOOLEAN NOT NULL DEFAULT FALSE")
    cursor.execute("ALTER TABLE images ADD COLUMN workflow TEXT")
    cursor.execute("ALTER TABLE images ADD COLUMN graph TEXT")
    cursor.execute("CREATE INDEX images_is_intermediate ON images (is_intermediate, created_at DESC)")
    # A batch's workflow is stored once, with its graph, and embedded in each image its items make.
    cursor.execute("ALTER TABLE session_queue_graphs ADD COLUMN workflow TEXT")


migration = Migration(version=7, description="image flags, workflow and graph; batch workflows", apply=_apply)
