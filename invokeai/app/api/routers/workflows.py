"""/api/v1/workflows, as InvokeAI 6.14.2 shapes it: the workflow library. Save, read, change and delete workflows;
list them (filtered, ordered, a page at a time), their tags and counts; record when one was opened."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.services.images import Direction
from invokeai.app.services.workflows import (
    MAX_PER_PAGE,
    DefaultWorkflowError,
    Workflow,
    WorkflowCategory,
    WorkflowOrderBy,
    WorkflowPage,
    WorkflowRecordDTO,
    WorkflowRecordWithThumbnailDTO,
    WorkflowWithoutID,
)

router = APIRouter(prefix="/workflows", tags=["workflows"], route_class=ApiRoute)

NOT_FOUND = {404: {"description": "No workflow of that id."}}
WorkflowId = Annotated[str, Path(max_length=255, description="The workflow's id.")]
MAX_FILTER_VALUES = 100
Categories = Annotated[
    list[WorkflowCategory] | None, Query(max_length=MAX_FILTER_VALUES, description="Only these categories.")
]
HasBeenOpened = Annotated[bool | None, Query(description="Only workflows opened (true) or never opened (false).")]
IsPublic = Annotated[bool | None, Query(description="Only public (true) or private (false) ones: all are public.")]
TagName = Annotated[str, Field(max_length=300)]


class CreateWorkflowBody(BaseModel):
    workflow: WorkflowWithoutID = Field(description="The workflow to save (its category must be user).")


class UpdateWorkflowBody(BaseModel):
    workflow: Workflow = Field(description="The workflow, with the id of the one it replaces.")


def _default_refused(error: DefaultWorkflowError, loc: list[str | int]) -> RequestValidationError:
    return RequestValidationError([{"loc": loc, "msg": str(error), "type": "value_error", "input": "default"}])


@router.post("/", operation_id="create_workflow", responses={409: {"description": "The library is full (10000)."}})
def create_workflow(body: CreateWorkflowBody, services: AppServices) -> WorkflowRecordDTO:
    """Save a new workflow under a new id; the answer is its record."""
    try:
        return services.workflows.create(body.workflow)
    except DefaultWorkflowError as error:
        raise _default_refused(error, ["body", "workflow", "meta", "category"]) from None


@router.get("/", operation_id="list_workflows")
def list_workflows(
    services: AppServices,
    page: Annotated[int, Query(ge=0, le=1_000_000, description="The page (from 0).")] = 0,
    per_page: Annotated[
        int | None, Query(ge=1, le=MAX_PER_PAGE, description="Workflows per page (not given: all of them).")
    ] = None,
    order_by: Annotated[WorkflowOrderBy, Query(description="What to order by.")] = "name",
    direction: Annotated[Direction, Query(description="ASC or DESC.")] = "ASC",
    categories: Categories = None,
    tags: Annotated[
        list[TagName] | None, Query(max_length=MAX_FILTER_VALUES, description="Only workflows with one of these tags.")
    ] = None,
    query: Annotated[
        str | None, Query(max_length=300, description="Only workflows whose name, description or tags hold this.")
    ] = None,
    has_been_opened: HasBeenOpened = None,
    is_public: IsPublic = None,
) -> WorkflowPage:
    """A page of the library (items without their workflow JSON: GET i/{workflow_id} has it)."""
    return services.workflows.list(
        page=page,
        per_page=per_page,
        order_by=order_by,
        direction=direction,
        categories=categories,
        tags=tags,
        query=query,
        has_been_opened=has_been_opened,
        is_public=is_public,
    )


@router.get("/tags", operation_id="get_all_tags")
def get_all_tags(services: AppServices, categories: Categories = None, is_public: IsPublic = None) -> list[str]:
    """Every tag of the library's workflows, sorted."""
    return services.workflows.tags(categories, is_public)


@router.get("/counts_by_tag", operation_id="get_counts_by_tag")
def get_counts_by_tag(
    services: AppServices,
    tags: Annotated[list[TagName], Query(max_length=MAX_FILTER_VALUES, description="The tags to count.")],
    categories: Categories = None,
    has_been_opened: HasBeenOpened = None,
    is_public: IsPublic = None,
) -> dict[str, int]:
    """For each tag, how many workflows have it."""
    return services.workflows.counts_by_tag(tags, categories, has_been_opened, is_public)


@router.get("/counts_by_category", operation_id="counts_by_category")
def counts_by_category(
    services: AppServices,
    categories: Annotated[
        list[WorkflowCategory], Query(max_length=MAX_FILTER_VALUES, description="The categories to count.")
    ],
    has_been_opened: HasBeenOpened = None,
    is_public: IsPublic = None,
) -> dict[str, int]:
    """For each category, how many workflows are of it."""
    return services.workflows.counts_by_category(categories, has_been_opened, is_public)


@router.get("/i/{workflow_id}", operation_id="get_workflow", responses=NOT_FOUND)
def get_workflow(workflow_id: WorkflowId, services: AppServices) -> WorkflowRecordWithThumbnailDTO:
    return services.workflows.get(workflow_id)


@router.patch(
    "/i/{workflow_id}",
    operation_id="update_workflow",
    responses={**NOT_FOUND, 422: {"description": "The body is invalid, or its workflow.id is not the path's."}},
)
def update_workflow(workflow_id: WorkflowId, body: UpdateWorkflowBody, services: AppServices) -> WorkflowRecordDTO:
    """Replace the workflow (its body's id names it, and must be the path's)."""
    if body.workflow.id != workflow_id:
        raise RequestValidationError(
            [
                {
                    "loc": ["body", "workflow", "id"],
                    "msg": f"the workflow's id must be the path's ({workflow_id!r})",
                    "type": "value_error",
                    "input": body.workflow.id,
                }
            ]
        )
    try:
        return services.workflows.update(body.workflow)
    except DefaultWorkflowError as error:
        raise _default_refused(error, ["body", "workflow", "meta", "category"]) from None


@router.delete("/i/{workflow_id}", operation_id="delete_workflow", responses=NOT_FOUND)
def delete_workflow(workflow_id: WorkflowId, services: AppServices) -> None:
    services.workflows.delete(workflow_id)


@router.put("/i/{workflow_id}/opened_at", operation_id="update_opened_at", responses=NOT_FOUND)
def update_opened_at(workflow_id: WorkflowId, services: AppServices) -> None:
    """Record that a client opened the workflow now (the library's recent list, has_been_opened)."""
    services.workflows.mark_opened(workflow_id)
