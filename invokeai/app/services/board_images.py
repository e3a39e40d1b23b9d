"""Which board each image is on: at most one (adding an image to a board moves it there), none for an
"uncategorized" image. Deleting the image or the board deletes its membership (ON DELETE CASCADE, migration 8)."""

from __future__ import annotations

from collections.abc import Sequence

from invokeai.app.services.boards import BoardNotFoundError
from invokeai.app.services.database import Database
from invokeai.app.services.images import (
    MAX_IMAGE_BATCH,
    MAX_IMAGE_NAMES,
    UNCATEGORIZED,
    ImageCategory,
    ImageNotFoundError,
    valid_name,
)
from invokeai.app.services.timestamps import now_iso


def _wanted(names: Sequence[str]) -> list[str]:
    if len(names) > MAX_IMAGE_BATCH:
        raise ValueError(f"at most {MAX_IMAGE_BATCH} names at once, not {len(names)}")
    return list(dict.fromkeys(name for name in names if valid_name(name)))


class BoardImageService:
    def __init__(self, db: Database) -> None:
        self._db = db

    def board_of(self, image_name: str) -> str:
        """The board the image is on, UNCATEGORIZED for none. Raises ImageNotFoundError."""
        if not valid_name(image_name):
            raise ImageNotFoundError(image_name)
        rows = self._db.execute(
            "SELECT board_images.board_id FROM images LEFT JOIN board_images "
            "ON board_images.image_name = images.image_name WHERE images.image_name = ?",
            (image_name,),
        )
        if not rows:
            raise ImageNotFoundError(image_name)
        return rows[0][0] or UNCATEGORIZED

    def add_many(self, board_id: str, image_names: Sequence[str]) -> tuple[list[str], list[str]]:
        """Put those of `image_names` that are images on the board (moving them from any other): (the names
        added, in the order given; the boards affected: this one and those they left, UNCATEGORIZED for none).
        Raises BoardNotFoundError."""
        wanted = _wanted(image_names)
        with self._db.transaction() as cursor:
            if cursor.execute("SELECT 1 FROM boards WHERE board_id = ?", (board_id,)).fetchone() is None:
                raise BoardNotFoundError(board_id)
            if not wanted:
                return [], []
            marks = ", ".join("?" for _ in wanted)
            rows = cursor.execute(
                "SELECT images.image_name, board_images.board_id FROM images LEFT JOIN board_images "
                f"ON board_images.image_name = images.image_name WHERE images.image_name IN ({marks})",
                wanted,
            ).fetchall()
            before = {row[0]: row[1] or UNCATEGORIZED for row in rows}
            added = [name for name in wanted if name in before]
            if not added:
                return [], []
            now = now_iso()
            cursor.executemany(
                "INSERT INTO board_images (image_name, board_id, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (image_name) DO UPDATE SET board_id = excluded.board_id, created_at = excluded.created_at",
                [(name, board_id, now) for name in added],
            )
        return added, list(dict.fromkeys([board_id, *before.values()]))

    def add(self, board_id: str, image_name: str) -> list[str]:
        """Put one image on the board; the boards affected. Raises BoardNotFoundError, ImageNotFoundError."""
        added, affected = self.add_many(board_id, [image_name])
        if not added:
            raise ImageNotFoundError(image_name)
        return affected

    def remove_many(self, image_names: Sequence[str]) -> tuple[list[str], list[str]]:
        """Take those of `image_names` that are images off their boards: (their names, in the order given; the
        boards affected, with UNCATEGORIZED, where they now are). An image on no board counts as removed."""
        wanted = _wanted(image_names)
        if not wanted:
            return [], []
        marks = ", ".join("?" for _ in wanted)
        with self._db.transaction() as cursor:
            rows = cursor.execute(
                "SELECT images.image_name, board_images.board_id FROM images LEFT JOIN board_images "
                f"ON board_images.image_name = images.image_name WHERE images.image_name IN ({marks})",
                wanted,
            ).fetchall()
            before = {row[0]: row[1] or UNCATEGORIZED for row in rows}
            cursor.execute(f"DELETE FROM board_images WHERE image_name IN ({marks})", wanted)
        removed = [name for name in wanted if name in before]
        affected = [UNCATEGORIZED, *before.values()] if removed else []
        return removed, list(dict.fromkeys(affected))

    def names_for_board(
        self,
        board_id: str,
        categories: Sequence[ImageCategory] | None = None,
        is_intermediate: bool | None = None,
    ) -> list[str]:
        """The names of the board's images (UNCATEGORIZED: of those on no board), newest first, at most
        MAX_IMAGE_NAMES. Raises BoardNotFoundError for a board that does not exist."""
        sql = [
            "SELECT images.image_name FROM images LEFT JOIN board_images ON board_images.image_name = images.image_name"
        ]
        params: list[object] = []
        if board_id == UNCATEGORIZED:
            sql.append("WHERE board_images.board_id IS NULL")
        else:
            if not self._db.execute("SELECT 1 FROM boards WHERE board_id = ?", (board_id,)):
                raise BoardNotFoundError(board_id)
            sql.append("WHERE board_images.board_id = ?")
            params.append(board_id)
        if categories is not None:
            chosen = sorted(set(categories))
            sql.append(f"AND images.image_category IN ({', '.join('?' for _ in chosen)})" if chosen else "AND 1 = 0")
            params.extend(chosen)
        if is_intermediate is not None:
            sql.append("AND images.is_intermediate = ?")
            params.append(is_intermediate)
        # As the image lists by default: a run that did not complete left nothing on the board to show.
        sql.append("AND images.of_incomplete_run = FALSE")
        sql.append("ORDER BY images.created_at DESC, images.rowid DESC LIMIT ?")
        params.append(MAX_IMAGE_NAMES)
        return [row[0] for row in self._db.execute(" ".join(sql), params)]
