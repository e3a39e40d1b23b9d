"""/api/v1/boards, as InvokeAI 6.14.2 shapes it: create, list (all, or a page), read, change and delete boards
(with or without their images), and the names of a board's images (or, for board 'none', of those on no board)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.services.boards import (
    MAX_BOARD_NAME,
    BoardChanges,
    BoardDTO,
    BoardOrderBy,
    CoverNotOnBoardError,
)
from invokeai.app.services.images import MAX_IMAGE_BATCH, UNCATEGORIZED, Direction, ImageCategory
from invokeai.app.services.pagination import OffsetPaginatedResults
from invokeai.app.services.queue_models import MAX_SQL_INT

router = APIRouter(prefix="/boards", tags=["boards"], route_class=ApiRoute)

NOT_FOUND = {404: {"description": "No board of that id."}}
MAX_PAGE_SIZE = 1000
BoardId = Annotated[str, Path(max_length=255, description="The board's id.")]


class DeleteBoardResult(BaseModel):
    board_id: str = Field(description="The id of the board deleted")
    deleted_board_images: list[str] = Field(
        description="Without include_images: the images that were on the board (now on none)"
    )
    deleted_images: list[str] = Field(description="With include_images: the images deleted")
    deleted_board_videos: list[str] = Field(default_factory=list, description="Always empty (no videos here)")
    deleted_videos: list[str] = Field(default_factory=list, description="Always empty (no videos here)")
    failed_images: list[str] = Field(default_factory=list, description="Always empty: a failure answers an error")
    failed_videos: list[str] = Field(default_factory=list, description="Always empty (no videos here)")


@router.post(
    "/",
    operation_id="create_board",
    status_code=status.HTTP_201_CREATED,
    responses={409: {"description": "The server already keeps as many boards as it keeps (10000)."}},
)
def create_board(
    services: AppServices,
    board_name: Annotated[str, Query(max_length=MAX_BOARD_NAME, description="The new board's name.")],
) -> BoardDTO:
    return services.boards.create(board_name)


@router.get(
    "/",
    operation_id="list_boards",
    responses={400: {"description": "Neither all=true nor both offset and limit were given."}},
)
def list_boards(
    services: AppServices,
    order_by: Annotated[BoardOrderBy, Query(description="Order by creation time or by name.")] = "created_at",
    direction: Annotated[Direction, Query(description="ASC or DESC.")] = "DESC",
    all: Annotated[bool | None, Query(description="Every board, as a list (else give offset and limit).")] = None,
    offset: Annotated[int | None, Query(ge=0, le=MAX_SQL_INT, description="How many to skip.")] = None,
    limit: Annotated[int | None, Query(ge=0, le=MAX_PAGE_SIZE, description="How many at most.")] = None,
    include_archived: Annotated[bool, Query(description="Archived boards too.")] = False,
) -> OffsetPaginatedResults[BoardDTO] | list[BoardDTO]:
    """Every board (all=true: a list), or a page of them (offset and limit), archived ones only when asked."""
    if all:
        boards, _ = services.boards.list(order_by=order_by, direction=direction, include_archived=include_archived)
        return boards
    if offset is None or limit is None:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "give either all=true or both offset and limit")
    boards, total = services.boards.list(
        order_by=order_by, direction=direction, include_archived=include_archived, offset=offset, limit=limit
    )
    return OffsetPaginatedResults[BoardDTO](items=boards, offset=offset, limit=limit, total=total)


@router.get("/{board_id}", operation_id="get_board", responses=NOT_FOUND)
def get_board(board_id: BoardId, services: AppServices) -> BoardDTO:
    return services.boards.get_dto(board_id)


@router.patch(
    "/{board_id}",
    operation_id="update_board",
    status_code=status.HTTP_201_CREATED,
    responses={**NOT_FOUND, 422: {"description": "A field is invalid, or cover_image_name is no image of the board."}},
)
def update_board(board_id: BoardId, changes: BoardChanges, services: AppServices) -> BoardDTO:
    """Rename, archive or unarchive a board, or choose its cover (an image on it). Answers 201, as InvokeAI's."""
    try:
        return services.boards.update(board_id, changes)
    except CoverNotOnBoardError as error:
        raise RequestValidationError(
            [
                {
                    "loc": ["body", "cover_image_name"],
                    "msg": str(error),
                    "type": "value_error",
                    "input": changes.cover_image_name,
                }
            ]
        ) from None


@router.delete("/{board_id}", operation_id="delete_board", responses=NOT_FOUND)
def delete_board(
    board_id: BoardId,
    services: AppServices,
    include_images: Annotated[bool | None, Query(description="Delete the board's images too.")] = False,
) -> DeleteBoardResult:
    """Delete the board. Its images stay, on no board, unless include_images: then they are deleted too."""
    services.boards.get_dto(board_id)
    if not include_images:
        names = services.board_images.names_for_board(board_id)
        services.boards.delete(board_id)
        return DeleteBoardResult(board_id=board_id, deleted_board_images=names, deleted_images=[])
    deleted: list[str] = []
    while names := services.board_images.names_for_board(board_id):
        for start in range(0, len(names), MAX_IMAGE_BATCH):
            deleted.extend(services.images.delete_many(names[start : start + MAX_IMAGE_BATCH]))
    services.boards.delete(board_id)
    return DeleteBoardResult(board_id=board_id, deleted_board_images=[], deleted_images=deleted)


@router.get("/{board_id}/image_names", operation_id="list_all_board_image_names", responses=NOT_FOUND)
def list_all_board_image_names(
    board_id: Annotated[str, Path(max_length=255, description=f"The board's id, or '{UNCATEGORIZED}' for none.")],
    services: AppServices,
    categories: Annotated[list[ImageCategory] | None, Query(description="Only images of these categories.")] = None,
    is_intermediate: Annotated[bool | None, Query(description="Only intermediate images, or none.")] = None,
) -> list[str]:
    """The names of the board's images, newest first (at most 100000)."""
    return services.board_images.names_for_board(board_id, categories, is_intermediate)
