"""/api/v1/images, as InvokeAI 6.14.2 shapes it: ImageDTOs, the gallery's lists (filters, order, names), an image's
metadata, workflow and URLs, changes and stars, deletes (one, a list, the intermediates), uploads, and the files
(full size or thumbnail)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Response, UploadFile, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field, StringConstraints

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute, BodyRefused, decode_json
from invokeai.app.services.boards import BoardNotFoundError
from invokeai.app.services.images import (
    MAX_IMAGE_BATCH,
    UNCATEGORIZED,
    Direction,
    ImageCategory,
    ImageDTO,
    ImageFilters,
    ImageNamesResult,
    ImageNotFoundError,
    ImageRecordChanges,
    ImageTooLargeError,
    ImageUrls,
    ResourceOrigin,
    image_urls,
)
from invokeai.app.services.pagination import OffsetPaginatedResults
from invokeai.app.services.queue_models import MAX_SQL_INT

router = APIRouter(prefix="/images", tags=["images"], route_class=ApiRoute)

NOT_FOUND = {404: {"description": "No image of that name."}}
MEDIA_TYPES = {".png": "image/png", ".webp": "image/webp"}
UPLOAD_CHUNK = 1024 * 1024
# InvokeAI's bounds: a page of at most 1000 DTOs; names at most 255 characters.
MAX_PAGE_SIZE = 1000
MAX_SEARCH_TERM = 300
# InvokeAI's bound on resize_to: at most 4096 * 4096 pixels.
MAX_RESIZE_PIXELS = 4096 * 4096

ImageName = Annotated[str, StringConstraints(max_length=255)]
BoardIdFilter = Annotated[
    str | None,
    Query(max_length=255, description=f"Only the images of this board; '{UNCATEGORIZED}': only those on no board."),
]
ImageOriginFilter = Annotated[
    ResourceOrigin | None, Query(description="Only images made here (internal) or uploaded (external).")
]
CategoriesFilter = Annotated[list[ImageCategory] | None, Query(description="Only images of these categories.")]
IntermediateFilter = Annotated[bool | None, Query(description="Only intermediate images (true), or none (false).")]
SearchTerm = Annotated[
    str | None,
    Query(max_length=MAX_SEARCH_TERM, description="Only images whose metadata or creation time holds this text."),
]
OrderDir = Annotated[Direction, Query(description="Oldest (ASC) or newest (DESC) first.")]
StarredFirst = Annotated[bool, Query(description="Starred images before the others.")]
IncompleteRunsFilter = Annotated[
    bool,
    Query(
        description="Also the images of queue runs that did not complete (failed, canceled, or interrupted and "
        "run again): left out by default, and removed by the queue's prune."
    ),
]


class ImageNamesBody(BaseModel):
    image_names: list[ImageName] = Field(max_length=MAX_IMAGE_BATCH, description="The names of the images.")


class DeleteImagesResult(BaseModel):
    deleted_images: list[str] = Field(description="The names of the images deleted")
    failed_images: list[str] = Field(description="Always empty: a failure to delete answers an error instead")
    affected_boards: list[str] = Field(description="The boards they were on ('none': on no board)")


class StarredImagesResult(BaseModel):
    starred_images: list[str] = Field(description="The names of the images starred")
    failed_images: list[str] = Field(description="Always empty: a name that is no image is left out")
    affected_boards: list[str] = Field(description="The boards they are on ('none': on no board)")


class UnstarredImagesResult(BaseModel):
    unstarred_images: list[str] = Field(description="The names of the images unstarred")
    failed_images: list[str] = Field(description="Always empty: a name that is no image is left out")
    affected_boards: list[str] = Field(description="The boards they are on ('none': on no board)")


class WorkflowAndGraphResponse(BaseModel):
    workflow: str | None = Field(description="The workflow the image was made with, as JSON text")
    graph: str | None = Field(description="The graph that made the image, as JSON text")


# An image file is written once under a new name (a uuid) and never changes, so a browser may keep it (as InvokeAI
# lets it, a year); private: not in a shared cache, since with api_token set it was fetched with the token.
IMAGE_CACHE_CONTROL = "private, max-age=31536000, immutable"


def _file(services: AppServices, path: Path) -> FileResponse:
    # Belt and braces: the service only returns paths of recorded images inside outputs_dir; check once more here,
    # where the file is handed to the client.
    if not path.resolve().is_relative_to(services.images.outputs_dir):
        raise ImageNotFoundError(path.name)
    return FileResponse(
        path,
        media_type=MEDIA_TYPES.get(path.suffix, "application/octet-stream"),
        headers={"Cache-Control": IMAGE_CACHE_CONTROL},
    )


def check_board(services: AppServices, board_id: str | None) -> None:
    if board_id is not None and board_id != UNCATEGORIZED and not services.boards.exists(board_id):
        raise BoardNotFoundError(board_id)


def image_filters(
    services: AppServices,
    image_origin: ResourceOrigin | None,
    categories: list[ImageCategory] | None,
    is_intermediate: bool | None,
    board_id: str | None,
    search_term: str | None,
    include_incomplete_runs: bool = False,
) -> ImageFilters:
    """The filters of InvokeAI's image lists, once board_id is known to name a board (or none)."""
    check_board(services, board_id)
    return ImageFilters(
        image_origin=image_origin,
        categories=tuple(categories) if categories is not None else None,
        is_intermediate=is_intermediate,
        board_id=board_id,
        search_term=search_term,
        include_incomplete_runs=include_incomplete_runs,
    )


@router.get("/", operation_id="list_image_dtos", responses={404: {"description": "board_id names no board."}})
def list_images(
    services: AppServices,
    image_origin: ImageOriginFilter = None,
    categories: CategoriesFilter = None,
    is_intermediate: IntermediateFilter = None,
    board_id: BoardIdFilter = None,
    offset: Annotated[int, Query(ge=0, le=MAX_SQL_INT, description="How many to skip.")] = 0,
    limit: Annotated[int, Query(ge=0, le=MAX_PAGE_SIZE, description="How many at most (0: only the total).")] = 10,
    order_dir: OrderDir = "DESC",
    starred_first: StarredFirst = True,
    search_term: SearchTerm = None,
    include_incomplete_runs: IncompleteRunsFilter = False,
) -> OffsetPaginatedResults[ImageDTO]:
    """A page of images, starred first (unless starred_first=false), then newest first (or oldest: order_dir=ASC),
    with the total the filters select. InvokeAI's gallery passes is_intermediate=false."""
    filters = image_filters(
        services, image_origin, categories, is_intermediate, board_id, search_term, include_incomplete_runs
    )
    items, total = services.images.list(
        offset, limit, filters=filters, starred_first=starred_first, direction=order_dir
    )
    return OffsetPaginatedResults[ImageDTO](items=items, offset=offset, limit=limit, total=total)


@router.get("/names", operation_id="get_image_names", responses={404: {"description": "board_id names no board."}})
def get_image_names(
    services: AppServices,
    image_origin: ImageOriginFilter = None,
    categories: CategoriesFilter = None,
    is_intermediate: IntermediateFilter = None,
    board_id: BoardIdFilter = None,
    order_dir: OrderDir = "DESC",
    starred_first: StarredFirst = True,
    search_term: SearchTerm = None,
    include_incomplete_runs: IncompleteRunsFilter = False,
) -> ImageNamesResult:
    """The names of the images the filters select, in the list's order (InvokeAI's gallery scrolls over these),
    at most 100000."""
    filters = image_filters(
        services, image_origin, categories, is_intermediate, board_id, search_term, include_incomplete_runs
    )
    return services.images.names(filters, starred_first=starred_first, direction=order_dir)


@router.post("/images_by_names", operation_id="get_images_by_names")
def get_images_by_names(body: ImageNamesBody, services: AppServices) -> list[ImageDTO]:
    """The DTOs of the named images, in the order asked; a name that is no image is left out."""
    return services.images.get_dtos(body.image_names)


@router.get("/intermediates", operation_id="get_intermediates_count")
def get_intermediates_count(services: AppServices) -> int:
    """How many intermediate images there are."""
    return services.images.intermediates_count()


@router.delete("/intermediates", operation_id="clear_intermediates")
def clear_intermediates(services: AppServices) -> int:
    """Delete every intermediate image; the answer is how many were deleted."""
    return services.images.delete_intermediates()


@router.get("/i/{image_name}", operation_id="get_image_dto", responses=NOT_FOUND)
def get_image_dto(image_name: str, services: AppServices) -> ImageDTO:
    return services.images.get_dto(image_name)


@router.patch("/i/{image_name}", operation_id="update_image", responses=NOT_FOUND)
def update_image(image_name: str, changes: ImageRecordChanges, services: AppServices) -> ImageDTO:
    """Change an image's category, session id, intermediate flag or star (the fields given)."""
    return services.images.update(image_name, changes)


@router.delete("/i/{image_name}", operation_id="delete_image", responses=NOT_FOUND)
def delete_image(image_name: str, services: AppServices) -> DeleteImagesResult:
    """Delete the image (its file, thumbnail, record and board membership)."""
    board = services.images.delete(image_name)
    return DeleteImagesResult(deleted_images=[image_name], failed_images=[], affected_boards=[board])


@router.post("/delete", operation_id="delete_images_from_list")
def delete_images_from_list(body: ImageNamesBody, services: AppServices) -> DeleteImagesResult:
    """Delete the named images; a name that is no image is left out of the answer."""
    deleted = services.images.delete_many(body.image_names)
    return DeleteImagesResult(
        deleted_images=list(deleted), failed_images=[], affected_boards=list(dict.fromkeys(deleted.values()))
    )


@router.post("/star", operation_id="star_images_in_list")
def star_images_in_list(body: ImageNamesBody, services: AppServices) -> StarredImagesResult:
    names, boards = services.images.set_starred(body.image_names, True)
    return StarredImagesResult(starred_images=names, failed_images=[], affected_boards=boards)


@router.post("/unstar", operation_id="unstar_images_in_list")
def unstar_images_in_list(body: ImageNamesBody, services: AppServices) -> UnstarredImagesResult:
    names, boards = services.images.set_starred(body.image_names, False)
    return UnstarredImagesResult(unstarred_images=names, failed_images=[], affected_boards=boards)


@router.get("/i/{image_name}/metadata", operation_id="get_image_metadata", responses=NOT_FOUND)
def get_image_metadata(image_name: str, services: AppServices) -> dict[str, Any] | None:
    """The metadata stored with the image (a core_metadata node's fields, or an upload's), or null."""
    return services.images.get_metadata(image_name)


@router.get("/i/{image_name}/workflow", operation_id="get_image_workflow", responses=NOT_FOUND)
def get_image_workflow(image_name: str, services: AppServices) -> WorkflowAndGraphResponse:
    workflow, graph = services.images.get_workflow_and_graph(image_name)
    return WorkflowAndGraphResponse(workflow=workflow, graph=graph)


@router.get("/i/{image_name}/urls", operation_id="get_image_urls", responses=NOT_FOUND)
def get_image_urls(image_name: str, services: AppServices) -> ImageUrls:
    services.images.get_record(image_name)
    return image_urls(image_name)


@router.get(
    "/i/{image_name}/full",
    operation_id="get_image_full",
    response_class=FileResponse,
    responses={200: {"content": {"image/png": {}}, "description": "The PNG."}, **NOT_FOUND},
)
def get_full(image_name: str, services: AppServices) -> FileResponse:
    """The PNG, with InvokeAI's invokeai_metadata, invokeai_workflow and invokeai_graph text chunks."""
    return _file(services, services.images.full_path(image_name))


@router.get(
    "/i/{image_name}/thumbnail",
    operation_id="get_image_thumbnail",
    response_class=FileResponse,
    responses={
        200: {"content": {"image/webp": {}}, "description": "A WEBP at most 256 px wide and high."},
        **NOT_FOUND,
    },
)
def get_thumbnail(image_name: str, services: AppServices) -> FileResponse:
    return _file(services, services.images.thumbnail_path(image_name))


def _form_error(field: str, message: str, value: str, loc: list[str | int] | None = None) -> RequestValidationError:
    return RequestValidationError(
        [{"loc": ["body", field, *(loc or [])], "msg": message, "type": "value_error", "input": value[:200]}]
    )


def _json_form_field(field: str, text: str) -> Any:
    """A form field holding JSON text, decoded as strictly as a JSON body (finite numbers, whole Unicode)."""
    try:
        return decode_json(text.encode("utf-8", "surrogatepass"))
    except BodyRefused as refused:
        if isinstance(refused.detail, list):
            raise RequestValidationError(
                [{**error, "loc": ["body", field, *error["loc"][1:]]} for error in refused.detail]
            ) from None
        raise _form_error(field, str(refused.detail), text) from None
    except json.JSONDecodeError as error:
        raise _form_error(field, f"not JSON text: {error.msg} (character {error.pos})", text) from None


def _resize_to(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    value = _json_form_field("resize_to", text)
    width = value.get("width") if isinstance(value, dict) else None
    height = value.get("height") if isinstance(value, dict) else None
    if not all(isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in (width, height)):
        raise _form_error("resize_to", 'must be JSON text of {"width": w, "height": h}, each a positive integer', text)
    assert isinstance(width, int) and isinstance(height, int)
    if width * height > MAX_RESIZE_PIXELS:
        raise _form_error("resize_to", f"at most {MAX_RESIZE_PIXELS} pixels", text)
    return width, height


def _metadata(text: str | None) -> str | None:
    if text is None:
        return None
    if not isinstance(_json_form_field("metadata", text), dict):
        raise _form_error("metadata", "must be JSON text of an object", text)
    return text


@router.post(
    "/upload",
    operation_id="upload_image",
    status_code=status.HTTP_201_CREATED,
    responses={
        404: {"description": "board_id names no board."},
        413: {"description": "The file is larger than max_upload_mb, or the image has too many pixels."},
        415: {"description": "The file is not an image that can be read."},
    },
)
def upload_image(
    file: Annotated[UploadFile, File(description="The image file.")],
    services: AppServices,
    response: Response,
    # InvokeAI requires both; its clients always send them, and an upload without them (a plain HTML form, curl)
    # is a user's image for the gallery.
    image_category: Annotated[
        ImageCategory, Query(description="What the image is for (InvokeAI's category); default: user.")
    ] = "user",
    is_intermediate: Annotated[
        bool, Query(description="Whether the image is intermediate (kept out of lists); default: false.")
    ] = False,
    board_id: Annotated[str | None, Query(max_length=255, description="The board to put it on.")] = None,
    session_id: Annotated[str | None, Query(max_length=255, description="The session to record it with.")] = None,
    crop_visible: Annotated[bool | None, Query(description="Cut away fully transparent borders.")] = False,
    resize_to: Annotated[
        str | None, Form(description='JSON text {"width": w, "height": h}: resize to that (at most 4096 * 4096 px).')
    ] = None,
    metadata: Annotated[
        str | None, Form(description="JSON text of an object: the image's metadata, instead of the file's own.")
    ] = None,
) -> ImageDTO:
    """Store an image (re-encoded as PNG, keeping an InvokeAI PNG's metadata, workflow and graph); nothing is
    stored unless it decodes completely."""
    check_board(services, board_id if board_id != UNCATEGORIZED else None)
    size = _resize_to(resize_to)
    metadata_text = _metadata(metadata)
    limit = services.images.max_upload_bytes
    # Read at most one byte past the limit: enough to know it is too large, without holding a huge upload.
    data = bytearray()
    while len(data) <= limit:
        chunk = file.file.read(min(UPLOAD_CHUNK, limit + 1 - len(data)))
        if not chunk:
            break
        data += chunk
    if len(data) > limit:
        raise ImageTooLargeError(f"the upload is larger than the limit of {limit} bytes (max_upload_mb)")
    record = services.images.upload(
        bytes(data),
        file.filename,
        image_category=image_category,
        is_intermediate=is_intermediate,
        board_id=board_id if board_id != UNCATEGORIZED else None,
        session_id=session_id,
        crop_visible=bool(crop_visible),
        resize_to=size,
        metadata=metadata_text,
    )
    dto = services.images.get_dto(record.image_name)
    response.headers["Location"] = dto.image_url
    return dto
