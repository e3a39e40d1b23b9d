"""/api/v1/board_images, as InvokeAI 6.14.2 shapes it: put images on a board (moving them from any other) and take
them off, one or a list at a time. Each answers 201 with the images done and the boards affected."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status
from pydantic import BaseModel, Field, StringConstraints

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.services.images import MAX_IMAGE_BATCH

router = APIRouter(prefix="/board_images", tags=["boards"], route_class=ApiRoute)

ImageName = Annotated[str, StringConstraints(max_length=255)]
BoardIdField = Annotated[str, StringConstraints(max_length=255)]
NOT_FOUND = {404: {"description": "No board of that id, or (one image) no image of that name."}}


class AddImageToBoardBody(BaseModel):
    board_id: BoardIdField = Field(description="The board to put the image on.")
    image_name: ImageName = Field(description="The image.")


class RemoveImageFromBoardBody(BaseModel):
    image_name: ImageName = Field(description="The image to take off its board.")


class AddImagesToBoardBody(BaseModel):
    board_id: BoardIdField = Field(description="The board to put the images on.")
    image_names: list[ImageName] = Field(max_length=MAX_IMAGE_BATCH, description="The images.")


class RemoveImagesFromBoardBody(BaseModel):
    image_names: list[ImageName] = Field(max_length=MAX_IMAGE_BATCH, description="The images.")


class AddImagesToBoardResult(BaseModel):
    added_images: list[str] = Field(description="The images now on the board")
    failed_images: list[str] = Field(description="Always empty: a name that is no image is left out")
    affected_boards: list[str] = Field(description="The board, and those the images left ('none': no board)")


class RemoveImagesFromBoardResult(BaseModel):
    removed_images: list[str] = Field(description="The images now on no board")
    failed_images: list[str] = Field(description="Always empty: a name that is no image is left out")
    affected_boards: list[str] = Field(description="'none', and the boards the images left")


@router.post("/", operation_id="add_image_to_board", status_code=status.HTTP_201_CREATED, responses=NOT_FOUND)
def add_image_to_board(body: AddImageToBoardBody, services: AppServices) -> AddImagesToBoardResult:
    affected = services.board_images.add(body.board_id, body.image_name)
    return AddImagesToBoardResult(added_images=[body.image_name], failed_images=[], affected_boards=affected)


@router.delete("/", operation_id="remove_image_from_board", status_code=status.HTTP_201_CREATED, responses=NOT_FOUND)
def remove_image_from_board(body: RemoveImageFromBoardBody, services: AppServices) -> RemoveImagesFromBoardResult:
    """Take the image off its board (an image on none stays so, and counts as removed)."""
    services.board_images.board_of(body.image_name)
    removed, affected = services.board_images.remove_many([body.image_name])
    return RemoveImagesFromBoardResult(removed_images=removed, failed_images=[], affected_boards=affected)


@router.post("/batch", operation_id="add_images_to_board", status_code=status.HTTP_201_CREATED, responses=NOT_FOUND)
def add_images_to_board(body: AddImagesToBoardBody, services: AppServices) -> AddImagesToBoardResult:
    added, affected = services.board_images.add_many(body.board_id, body.image_names)
    return AddImagesToBoardResult(added_images=added, failed_images=[], affected_boards=affected)


@router.post("/batch/delete", operation_id="remove_images_from_board", status_code=status.HTTP_201_CREATED)
def remove_images_from_board(body: RemoveImagesFromBoardBody, services: AppServices) -> RemoveImagesFromBoardResult:
    removed, affected = services.board_images.remove_many(body.image_names)
    return RemoveImagesFromBoardResult(removed_images=removed, failed_images=[], affected_boards=affected)
