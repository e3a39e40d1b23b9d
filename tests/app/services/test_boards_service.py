"""BoardService and BoardImageService on both engines: boards with their counts and cover, membership (one board
per image, moved by adding), what deleting a board or an image does, lists and bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_support import ENGINES
from PIL import Image

from invokeai.app.services.board_images import BoardImageService
from invokeai.app.services.boards import (
    BoardChanges,
    BoardNotFoundError,
    BoardService,
    CoverNotOnBoardError,
    TooManyBoardsError,
)
from invokeai.app.services.database import Database
from invokeai.app.services.images import UNCATEGORIZED, ImageNotFoundError, ImageService


@pytest.fixture
def images(db: Database, tmp_path: Path) -> ImageService:
    return ImageService(db, tmp_path / "outputs", max_upload_bytes=1_000_000)


@pytest.fixture
def boards(db: Database) -> BoardService:
    return BoardService(db)


@pytest.fixture
def members(db: Database) -> BoardImageService:
    return BoardImageService(db)


def _image(images: ImageService, **options: object) -> str:
    return images.save(Image.new("L", (2, 2)), **options).image_name  # type: ignore[arg-type]


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_a_board_counts_its_images_and_assets_and_shows_a_cover(
    images: ImageService, boards: BoardService, members: BoardImageService
) -> None:
    board = boards.create("Foxes")
    assert (board.board_name, board.image_count, board.asset_count, board.cover_image_name) == ("Foxes", 0, 0, None)
    assert (board.user_id, board.archived, board.board_visibility) == ("system", False, "private")
    first, second = _image(images), _image(images)
    mask = _image(images, image_category="mask")
    _image(images, is_intermediate=True, board_id=board.board_id)  # not counted, never the cover
    assert members.add_many(board.board_id, [first, second, mask, "no-such.png"]) == (
        [first, second, mask],
        [board.board_id, UNCATEGORIZED],
    )
    dto = boards.get_dto(board.board_id)
    assert (dto.image_count, dto.asset_count, dto.cover_image_name) == (2, 1, mask)
    images.set_starred([first], True)
    assert boards.get_dto(board.board_id).cover_image_name == first  # starred first, as InvokeAI picks it
    # A chosen cover wins while it is on the board.
    assert boards.update(board.board_id, BoardChanges(cover_image_name=second)).cover_image_name == second
    members.remove_many([second])
    assert boards.get_dto(board.board_id).cover_image_name == first
    with pytest.raises(CoverNotOnBoardError):
        boards.update(board.board_id, BoardChanges(cover_image_name=second))


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_an_image_is_on_one_board_and_adding_moves_it(
    images: ImageService, boards: BoardService, members: BoardImageService
) -> None:
    a, b = boards.create("a").board_id, boards.create("b").board_id
    name = _image(images)
    assert members.board_of(name) == UNCATEGORIZED
    assert members.add(a, name) == [a, UNCATEGORIZED]
    assert members.add(b, name) == [b, a]
    assert members.board_of(name) == b and images.get_dto(name).board_id == b
    assert members.names_for_board(a) == [] and members.names_for_board(b) == [name]
    assert members.remove_many([name, name]) == ([name], [UNCATEGORIZED, b])
    assert members.names_for_board(UNCATEGORIZED) == [name]
    # Off no board is off already: still "removed", as InvokeAI answers.
    assert members.remove_many([name]) == ([name], [UNCATEGORIZED])
    with pytest.raises(BoardNotFoundError):
        members.add("no-such-board", name)
    with pytest.raises(ImageNotFoundError):
        members.add(a, "0" * 32 + ".png")
    with pytest.raises(BoardNotFoundError):
        members.names_for_board("no-such-board")
    with pytest.raises(ValueError, match="at most 1000"):
        members.add_many(a, [name] * 1001)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_deleting_a_board_leaves_its_images_uncategorized_and_deleting_an_image_leaves_the_board(
    images: ImageService, boards: BoardService, members: BoardImageService
) -> None:
    board = boards.create("b").board_id
    kept, gone = _image(images, board_id=board), _image(images, board_id=board)
    assert sorted(members.names_for_board(board, categories=["general"], is_intermediate=False)) == sorted([kept, gone])
    assert members.names_for_board(board, categories=["mask"]) == []
    images.delete(gone)
    assert members.names_for_board(board) == [kept]
    boards.delete(board)
    assert images.get_dto(kept).board_id is None
    assert members.names_for_board(UNCATEGORIZED) == [kept]
    with pytest.raises(BoardNotFoundError):
        boards.get_dto(board)
    with pytest.raises(BoardNotFoundError):
        boards.delete(board)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_boards_are_listed_in_the_order_asked_without_archived_ones(boards: BoardService) -> None:
    made = [boards.create(name).board_id for name in ("beta", "Alpha", "gamma")]
    boards.update(made[2], BoardChanges(archived=True, board_name="Delta"))

    def ids(**options: object) -> list[str]:
        return [board.board_id for board in boards.list(**options)[0]]  # type: ignore[arg-type]

    assert ids() == [made[1], made[0]]
    assert ids(include_archived=True) == made[::-1]
    assert ids(order_by="board_name", direction="ASC", include_archived=True) == [made[1], made[0], made[2]]
    listed, total = boards.list(include_archived=True, offset=1, limit=1)
    assert ([board.board_id for board in listed], total) == ([made[1]], 3)
    with pytest.raises(BoardNotFoundError):
        boards.update("no-such-board", BoardChanges(archived=True))


def test_the_number_of_boards_is_bounded(db: Database) -> None:
    boards = BoardService(db, max_boards=2)
    boards.create("a")
    boards.create("b")
    with pytest.raises(TooManyBoardsError, match="at most 2 boards"):
        boards.create("c")
    with pytest.raises(ValueError, match="at most 300"):
        boards.create("x" * 301)
