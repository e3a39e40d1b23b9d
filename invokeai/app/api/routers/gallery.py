"""/api/v1/gallery: InvokeAI's gallery reads the names of its items (images and videos interleaved) here. This server
makes no videos, so the items are the images, in the order and with the filters of images/names."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.api.routers.images import (
    BoardIdFilter,
    CategoriesFilter,
    ImageOriginFilter,
    IncompleteRunsFilter,
    IntermediateFilter,
    OrderDir,
    SearchTerm,
    StarredFirst,
    image_filters,
)

router = APIRouter(prefix="/gallery", tags=["gallery"], route_class=ApiRoute)


class GalleryItemNames(BaseModel):
    item_names: list[str] = Field(description="The names of the items the filters select, in the gallery's order.")
    starred_count: int = Field(description="How many of them are starred (when starred_first).")
    total_count: int = Field(description="How many items the filters select.")


@router.get("/item_names", operation_id="get_gallery_item_names", responses={404: {"description": "No such board."}})
def get_item_names(
    services: AppServices,
    origin: ImageOriginFilter = None,
    categories: CategoriesFilter = None,
    is_intermediate: IntermediateFilter = None,
    board_id: BoardIdFilter = None,
    order_dir: OrderDir = "DESC",
    starred_first: StarredFirst = True,
    search_term: SearchTerm = None,
    include_incomplete_runs: IncompleteRunsFilter = False,
) -> GalleryItemNames:
    filters = image_filters(
        services, origin, categories, is_intermediate, board_id, search_term, include_incomplete_runs
    )
    names = services.images.names(filters, starred_first=starred_first, direction=order_dir)
    return GalleryItemNames(
        item_names=names.image_names, starred_count=names.starred_count, total_count=names.total_count
    )
