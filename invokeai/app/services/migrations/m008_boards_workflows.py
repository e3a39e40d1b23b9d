"""Migration 8: what InvokeAI's gallery, boards, client state and workflow library keep.

- images: `starred` and `updated_at` (InvokeAI's ImageDTO has both; existing images were last changed when made).
- boards, and board_images: which board an image is on (at most one; none means "uncategorized"). Deleting an image
  or a board deletes its memberships, so an image of a deleted board is uncategorized again.
- client_state: the small key/value store InvokeAI's web UI keeps its settings in, per user.
- workflow_library: the workflows clients save, with the columns the library lists and filters by.
"""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration


def _apply(cursor: Cursor) -> None:
    cursor.execute("ALTER TABLE images ADD COLUMN starred BOOLEAN NOT NULL DEFAULT FALSE")
    cursor.execute("ALTER TABLE images ADD COLUMN updated_at TEXT")
    cursor.execute("UPDATE images SET updated_at = created_at")
    # The gallery's order: starred first, then newest (or oldest) first.
    cursor.execute("CREATE INDEX images_starred_created_at ON images (starred, created_at)")
    cursor.execute(
        """
        CREATE TABLE boards (
            board_id TEXT PRIMARY KEY,
            board_name TEXT NOT NULL,
            cover_image_name TEXT,
            archived BOOLEAN NOT NULL DEFAULT FALSE,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """
    )
    cursor.execute("CREATE INDEX boards_created_at ON boards (created_at)")
    cursor.execute(
        """
        CREATE TABLE board_images (
            image_name TEXT PRIMARY KEY REFERENCES images (image_name) ON DELETE CASCADE,
            board_id TEXT NOT NULL REFERENCES boards (board_id) ON DELETE CASCADE,
            created_at TEXT NOT NULL
        )
        """
    )
    cursor.execute("CREATE INDEX board_images_board_id ON board_images (board_id)")
    cursor.execute(
        """
        CREATE TABLE client_state (
            user_id TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (user_id, key)
        )
        """
    )
    cursor.execute(
        """
        CREATE TABLE workflow_library (
            workflow_id TEXT PRIMARY KEY,
            workflow TEXT NOT NULL,
            name TEXT NOT NULL,
            description TEXT NOT NULL,
            tags TEXT NOT NULL,
            category TEXT NOT NULL,
            user_id TEXT NOT NULL,
            is_public BOOLEAN NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            opened_at TEXT
        )
        """
    )
    cursor.execute("CREATE INDEX workflow_library_name ON workflow_library (name)")
    cursor.execute("CREATE INDEX workflow_library_opened_at ON workflow_library (opened_at)")


migration = Migration(
    version=8, description="starred images, boards, client state and the workflow library", apply=_apply
)
