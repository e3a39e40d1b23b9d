"""Boards: named groups of images, as InvokeAI's gallery has them. An image is on at most one board (board_images.py);
one on none is "uncategorized". Each board's counts and cover are computed when it is read."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from invokeai.app.services.database import Database, Row
from invokeai.app.services.images import ASSET_CATEGORIES, IMAGE_CATEGORIES, BoardNotFoundError, Direction
from invokeai.app.services.timestamps import now_iso

# InvokeAI's bound on a board's name.
MAX_BOARD_NAME = 300
# A bound on what one server keeps, and on what `GET boards/?all=true` answers at once.
MAX_BOARDS = 10_000
# This server has one user; InvokeAI records single-user boards as the "system" user's.
SYSTEM_USER = "system"

BoardOrderBy = Literal["created_at", "board_name"]


class BoardDTO(BaseModel):
    board_id: str = Field(description="The board's id")
    board_name: str = Field(description="The board's name")
    user_id: str = Field(description="Its owner: always 'system' (this server has one user)")
    created_at: str = Field(description="When the board was made (ISO 8601, UTC)")
    updated_at: str = Field(description="When it last changed (ISO 8601, UTC)")
    deleted_at: str | None = Field(default=None, description="Always null: a deleted board is gone")
    cover_image_name: str | None = Field(
        description="The image set as its cover while that image is on the board; else its newest image "
        "(starred first), as InvokeAI picks it; null for a board with no image"
    )
    archived: bool = Field(description="Archived boards are left out of lists unless include_archived")
    board_visibility: Literal["private"] = Field(default="private", description="Always private (one user)")
    image_count: int = Field(description="How many of its images are of the general category and not intermediate")
    video_count: int = Field(default=0, description="Always 0: this server keeps no videos")
    asset_count: int = Field(description="How many of its images are assets (control, mask, user, other)")


class BoardChanges(BaseModel):
    """What a client may change of a board; a field left out (or null) is left as it is."""

    model_config = ConfigDict(extra="forbid")

    board_name: str | None = Field(default=None, max_length=MAX_BOARD_NAME, description="The board's new name")
    cover_image_name: str | None = Field(
        default=None, max_length=255, description="An image on the board to show as its cover"
    )
    archived: bool | None = Field(default=None, description="Whether the board is archived")


class TooManyBoardsError(RuntimeError):
    pass


class CoverNotOnBoardError(ValueError):
    pass


def _in(values: tuple[str, ...]) -> str:
    # The categories are this module's constants, never a client's input.
    return ", ".join(f"'{value}'" for value in values)


_COUNT = (
    "SELECT COUNT(*) FROM board_images bi JOIN images i ON i.image_name = bi.image_name "
    "WHERE bi.board_id = boards.board_id AND i.is_intermediate = FALSE AND i.of_incomplete_run = FALSE "
    "AND i.image_category IN ({categories})"
)
_SELECT_DTO = f"""
    SELECT boards.board_id, boards.board_name, boards.archived, boards.created_at, boards.updated_at,
        ({_COUNT.format(categories=_in(IMAGE_CATEGORIES))}) AS image_count,
        ({_COUNT.format(categories=_in(ASSET_CATEGORIES))}) AS asset_count,
        (SELECT bi.image_name FROM board_images bi
            WHERE bi.board_id = boards.board_id AND bi.image_name = boards.cover_image_name) AS chosen_cover,
        (SELECT i.image_name FROM board_images bi JOIN images i ON i.image_name = bi.image_name
            WHERE bi.board_id = boards.board_id AND i.is_intermediate = FALSE AND i.of_incomplete_run = FALSE
            ORDER BY i.starred DESC, i.created_at DESC, i.image_name DESC LIMIT 1) AS newest_image
    FROM boards
"""


def _row_to_dto(row: Row) -> BoardDTO:
    return BoardDTO(
        board_id=row["board_id"],
        board_name=row["board_name"],
        user_id=SYSTEM_USER,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        cover_image_name=row["chosen_cover"] or row["newest_image"],
        archived=bool(row["archived"]),
        image_count=int(row["image_count"]),
        asset_count=int(row["asset_count"]),
    )


class BoardService:
    def __init__(self, db: Database, max_boards: int = MAX_BOARDS) -> None:
        self._db = db
        self.max_boards = max_boards

    def create(self, board_name: str) -> BoardDTO:
        if len(board_name) > MAX_BOARD_NAME:
            raise ValueError(f"a board name has at most {MAX_BOARD_NAME} characters")
        board_id = str(uuid.uuid4())
        now = now_iso()
        with self._db.transaction() as cursor:
            count = int(cursor.execute("SELECT COUNT(*) FROM boards").fetchone()[0])
            if count >= self.max_boards:
                raise TooManyBoardsError(
                    f"the server keeps at most {self.max_boards} boards, and has as many: delete one first"
                )
            cursor.execute(
                "INSERT INTO boards (board_id, board_name, archived, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                (board_id, board_name, False, now, now),
            )
        return self.get_dto(board_id)

    def exists(self, board_id: str) -> bool:
        return bool(self._db.execute("SELECT 1 FROM boards WHERE board_id = ?", (board_id,)))

    def get_dto(self, board_id: str) -> BoardDTO:
        rows = self._db.execute(f"{_SELECT_DTO} WHERE boards.board_id = ?", (board_id,))
        if not rows:
            raise BoardNotFoundError(board_id)
        return _row_to_dto(rows[0])

    def update(self, board_id: str, changes: BoardChanges) -> BoardDTO:
        values: dict[str, Any] = changes.model_dump(exclude_none=True)
        with self._db.transaction() as cursor:
            if cursor.execute("SELECT 1 FROM boards WHERE board_id = ?", (board_id,)).fetchone() is None:
                raise BoardNotFoundError(board_id)
            cover = values.get("cover_image_name")
            if cover is not None and (
                cursor.execute(
                    "SELECT 1 FROM board_images WHERE board_id = ? AND image_name = ?", (board_id, cover)
                ).fetchone()
                is None
            ):
                raise CoverNotOnBoardError(f"{cover!r} is not an image on board {board_id!r}")
            if values:
                columns = ", ".join(f"{column} = ?" for column in values)
                cursor.execute(
                    f"UPDATE boards SET {columns}, updated_at = ? WHERE board_id = ?",
                    (*values.values(), now_iso(), board_id),
                )
        return self.get_dto(board_id)

    def delete(self, board_id: str) -> None:
        """Delete the board; its images stay, uncategorized (their memberships go with it: ON DELETE CASCADE)."""
        with self._db.transaction() as cursor:
            cursor.execute("DELETE FROM boards WHERE board_id = ?", (board_id,))
            if cursor.rowcount == 0:
                raise BoardNotFoundError(board_id)

    def list(
        self,
        *,
        order_by: BoardOrderBy = "created_at",
        direction: Direction = "DESC",
        include_archived: bool = False,
        offset: int = 0,
        limit: int | None = None,
    ) -> tuple[list[BoardDTO], int]:
        """The boards in the order asked (all of them, or a page), and how many there are."""
        if order_by not in ("created_at", "board_name") or direction not in ("ASC", "DESC"):
            raise ValueError(f"cannot order by {order_by!r} {direction!r}")
        where = "" if include_archived else "WHERE boards.archived = FALSE"
        # Names in any case together, as InvokeAI sorts them; the id keeps the order total.
        key = "LOWER(boards.board_name)" if order_by == "board_name" else "boards.created_at"
        page = "LIMIT ? OFFSET ?"
        params = (self.max_boards if limit is None else limit, offset)
        with self._db.read_transaction():
            total = int(self._db.execute(f"SELECT COUNT(*) AS n FROM boards {where}")[0]["n"])
            rows = self._db.execute(
                f"{_SELECT_DTO} {where} ORDER BY {key} {direction}, boards.board_id {direction} {page}", params
            )
        return [_row_to_dto(row) for row in rows], total
