"""/api/v1/images: list, read, download (full size or thumbnail), delete and upload images."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, File, Query, UploadFile, status
from fastapi.responses import FileResponse
from pydantic import BaseModel

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.services.images import ImageNotFoundError, ImageRecord, ImageTooLargeError
from invokeai.app.services.queue_models import MAX_SQL_INT

router = APIRouter(prefix="/images", tags=["images"], route_class=ApiRoute)

NOT_FOUND = {404: {"description": "No image of that name."}}
MEDIA_TYPES = {".png": "image/png", ".webp": "image/webp"}
UPLOAD_CHUNK = 1024 * 1024


class ImageRecordPage(BaseModel):
    items: list[ImageRecord]
    offset: int
    limit: int
    total: int


def _file(services: AppServices, path: Path) -> FileResponse:
    # Belt and braces: the service only returns paths of recorded images inside outputs_dir; check once more here,
    # where the file is handed to the client.
    if not path.resolve().is_relative_to(services.images.outputs_dir):
        raise ImageNotFoundError(path.name)
    return FileResponse(path, media_type=MEDIA_TYPES.get(path.suffix, "application/octet-stream"))


@router.get("/", operation_id="list_images")
def list_images(
    services: AppServices,
    offset: Annotated[int, Query(ge=0, le=MAX_SQL_INT)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> ImageRecordPage:
    """Image records, newest first."""
    records, total = services.images.list(offset, limit)
    return ImageRecordPage(items=records, offset=offset, limit=limit, total=total)


@router.get("/i/{image_name}", operation_id="get_image_record", responses=NOT_FOUND)
def get_record(image_name: str, services: AppServices) -> ImageRecord:
    return services.images.get_record(image_name)


@router.get(
    "/i/{image_name}/full",
    operation_id="get_image_full",
    response_class=FileResponse,
    responses={200: {"content": {"image/png": {}}, "description": "The PNG."}, **NOT_FOUND},
)
def get_full(image_name: str, services: AppServices) -> FileResponse:
    """The PNG, with the graph and node that made it in its invokeai_metadata text chunk."""
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


@router.delete(
    "/i/{image_name}", operation_id="delete_image", status_code=status.HTTP_204_NO_CONTENT, responses=NOT_FOUND
)
def delete_image(image_name: str, services: AppServices) -> None:
    services.images.delete(image_name)


@router.post(
    "/upload",
    operation_id="upload_image",
    status_code=status.HTTP_201_CREATED,
    responses={
        413: {"description": "The file is larger than max_upload_mb, or the image has too many pixels."},
        415: {"description": "The file is not an image that can be read."},
    },
)
def upload_image(
    file: Annotated[UploadFile, File(description="The image file.")], services: AppServices
) -> ImageRecord:
    """Store an image (re-encoded as PNG); nothing is stored unless it decodes completely."""
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
    return services.images.upload(bytes(data), file.filename)
