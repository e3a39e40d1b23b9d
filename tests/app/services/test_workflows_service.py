"""WorkflowService on both engines: saving, reading, replacing and deleting workflows; the library's lists with
InvokeAI's filters, order and pages; tags and counts; opened_at; bounds."""

from __future__ import annotations

from typing import Any

import pytest
from engine_support import ENGINES
from pydantic import ValidationError

from invokeai.app.services.database import Database
from invokeai.app.services.workflows import (
    DefaultWorkflowError,
    Workflow,
    WorkflowLibraryFullError,
    WorkflowNotFoundError,
    WorkflowService,
    WorkflowWithoutID,
)


def workflow(name: str, **fields: Any) -> WorkflowWithoutID:
    document: dict[str, Any] = {
        "name": name,
        "author": "me",
        "description": "",
        "version": "1.0.0",
        "contact": "",
        "tags": "",
        "notes": "",
        "exposedFields": [{"nodeId": "n", "fieldName": "seed"}],
        "meta": {"version": "3.0.0", "category": "user"},
        "nodes": [{"id": "n", "type": "invocation", "data": {"type": "noise"}}],
        "edges": [],
        "unknown_field": "dropped, as InvokeAI drops it",
        **fields,
    }
    return WorkflowWithoutID.model_validate(document)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_a_workflow_is_saved_read_replaced_and_deleted(db: Database) -> None:
    library = WorkflowService(db)
    record = library.create(workflow("Text to image", tags="sd, fast"))
    assert (record.name, record.user_id, record.is_public, record.opened_at) == ("Text to image", "system", True, None)
    assert record.workflow.id == record.workflow_id
    assert record.workflow.nodes == [{"id": "n", "type": "invocation", "data": {"type": "noise"}}]
    assert "unknown_field" not in record.workflow.model_dump()
    got = library.get(record.workflow_id)
    assert got.workflow == record.workflow and got.thumbnail_url is None
    changed = Workflow(**{**record.workflow.model_dump(), "name": "Renamed", "description": "new"})
    updated = library.update(changed)
    assert (updated.name, updated.workflow.description) == ("Renamed", "new")
    assert updated.updated_at > record.updated_at and updated.created_at == record.created_at
    library.mark_opened(record.workflow_id)
    assert library.get(record.workflow_id).opened_at is not None
    library.delete(record.workflow_id)
    for call in (library.get, library.delete, library.mark_opened):
        with pytest.raises(WorkflowNotFoundError):
            call(record.workflow_id)
    with pytest.raises(WorkflowNotFoundError):
        library.update(changed)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_the_library_lists_with_invokeai_s_filters_order_and_pages(db: Database) -> None:
    library = WorkflowService(db)
    upscale = library.create(workflow("Upscale", tags="upscale, esrgan", description="Bigger images"))
    sdxl = library.create(workflow("sdxl text", tags="SDXL"))
    flux = library.create(workflow("Flux_dev", tags="flux"))
    library.mark_opened(sdxl.workflow_id)

    def names(**options: Any) -> list[str]:
        return [item.name for item in library.list(**options).items]

    assert names() == ["Flux_dev", "Upscale", "sdxl text"]  # by name, ascending
    assert names(direction="DESC") == ["sdxl text", "Upscale", "Flux_dev"]
    assert names(order_by="created_at") == ["Upscale", "sdxl text", "Flux_dev"]
    assert names(query="BIGGER") == ["Upscale"]  # name, description or tags, whatever the case
    assert names(query="flu_") == []  # _ is only itself (as a wildcard it would match "flux")
    assert names(tags=["sdxl", "flux"]) == ["Flux_dev", "sdxl text"]
    assert names(has_been_opened=True) == ["sdxl text"]
    assert names(has_been_opened=False) == ["Flux_dev", "Upscale"]
    assert names(order_by="opened_at", direction="DESC")[0] == "sdxl text"
    assert names(categories=["default"]) == []
    assert names(is_public=False) == []
    page = library.list(page=1, per_page=2)
    assert (page.page, page.pages, page.per_page, page.total, [i.name for i in page.items]) == (
        1,
        2,
        2,
        3,
        ["sdxl text"],
    )
    whole = library.list()
    assert (whole.pages, whole.per_page, whole.total) == (1, 3, 3)
    item = whole.items[1]
    assert (item.workflow_id, item.description, item.category, item.tags) == (
        upscale.workflow_id,
        "Bigger images",
        "user",
        "upscale, esrgan",
    )
    assert library.tags() == ["SDXL", "esrgan", "flux", "upscale"]
    assert library.counts_by_tag(["upscale", "sdxl", "none"]) == {"upscale": 1, "sdxl": 1, "none": 0}
    assert library.counts_by_tag(["sdxl"], has_been_opened=False) == {"sdxl": 0}
    assert library.counts_by_category(["user", "default"]) == {"user": 3, "default": 0}
    assert flux.workflow_id in {i.workflow_id for i in whole.items}


def test_default_workflows_are_not_saved_and_the_library_is_bounded(db: Database) -> None:
    library = WorkflowService(db, max_workflows=1)
    with pytest.raises(DefaultWorkflowError):
        library.create(workflow("w", meta={"version": "3.0.0", "category": "default"}))
    library.create(workflow("w"))
    with pytest.raises(WorkflowLibraryFullError, match="at most 1 workflows"):
        library.create(workflow("w2"))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"author": 3}, "author"),
        ({"meta": {"version": "3.0", "category": "user"}}, "meta.version"),
        ({"meta": {"version": "3.0.0", "category": "mine"}}, "meta.category"),
        ({"nodes": {"n": {}}}, "nodes"),
    ],
)
def test_an_invalid_workflow_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        workflow("w", **fields)
    with pytest.raises(ValidationError, match="at most 300 characters"):
        workflow("n" * 301)
    assert field in {".".join(map(str, error["loc"])) for error in refused.value.errors()}
