"""/api/v1/workflows as InvokeAI 6.14.2 has it: the library's CRUD with its shapes (its required fields), the list
with its filters and pages, counts, opened_at; and what is refused: bad fields (422 naming them), a body over the
limit (413), non-finite numbers and lone surrogates (422)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from api_support import MakeClient
from fastapi.testclient import TestClient

WORKFLOWS = "/api/v1/workflows"
# InvokeAI 6.14.2's required fields of WorkflowRecordDTO, of a list item, and of the page.
RECORD_REQUIRED = {"workflow_id", "name", "created_at", "updated_at", "user_id", "is_public", "workflow"}
ITEM_REQUIRED = {"workflow_id", "name", "created_at", "updated_at", "user_id", "is_public", "description"}
ITEM_REQUIRED |= {"category", "tags"}
PAGE_REQUIRED = {"page", "pages", "per_page", "total", "items"}


def workflow(name: str = "Text to image", **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "author": "me",
        "description": "",
        "version": "1.0.0",
        "contact": "",
        "tags": "sd",
        "notes": "",
        "exposedFields": [],
        "meta": {"version": "3.0.0", "category": "user"},
        "nodes": [],
        "edges": [],
        **fields,
    }


def create(client: TestClient, **fields: Any) -> dict[str, Any]:
    response = client.post(f"{WORKFLOWS}/", json={"workflow": workflow(**fields)})
    assert response.status_code == 200, response.text
    record: dict[str, Any] = response.json()
    return record


def test_a_workflow_is_created_read_listed_changed_and_deleted(client: TestClient) -> None:
    record = create(client, form={"rootElementId": "root"})
    assert RECORD_REQUIRED <= set(record)
    workflow_id = record["workflow_id"]
    assert record["workflow"]["id"] == workflow_id and record["workflow"]["form"] == {"rootElementId": "root"}
    got = client.get(f"{WORKFLOWS}/i/{workflow_id}").json()
    assert got["workflow"] == record["workflow"] and "thumbnail_url" in got
    page = client.get(f"{WORKFLOWS}/", params={"per_page": 10}).json()
    assert PAGE_REQUIRED <= set(page) and ITEM_REQUIRED <= set(page["items"][0])
    assert [item["workflow_id"] for item in page["items"]] == [workflow_id]
    changed = {**record["workflow"], "name": "Renamed"}
    response = client.patch(f"{WORKFLOWS}/i/{workflow_id}", json={"workflow": changed})
    assert response.status_code == 200 and response.json()["name"] == "Renamed"
    assert client.put(f"{WORKFLOWS}/i/{workflow_id}/opened_at").status_code == 200
    assert client.get(f"{WORKFLOWS}/", params={"has_been_opened": True}).json()["total"] == 1
    deleted = client.delete(f"{WORKFLOWS}/i/{workflow_id}")
    assert (deleted.status_code, deleted.json()) == (200, None)
    for method, url in (("GET", ""), ("DELETE", ""), ("PUT", "/opened_at")):
        assert client.request(method, f"{WORKFLOWS}/i/{workflow_id}{url}").status_code == 404
    assert client.patch(f"{WORKFLOWS}/i/{workflow_id}", json={"workflow": changed}).status_code == 404


def test_the_list_filters_orders_and_counts(client: TestClient) -> None:
    create(client, name="b", tags="upscale")
    create(client, name="A", tags="sdxl, upscale", description="big")
    create(client, name="c", tags="flux")

    def names(**params: Any) -> list[str]:
        response = client.get(f"{WORKFLOWS}/", params=params)
        assert response.status_code == 200, response.text
        return [item["name"] for item in response.json()["items"]]

    assert names() == ["A", "b", "c"]
    assert names(order_by="created_at", direction="DESC") == ["c", "A", "b"]
    assert names(tags=["flux", "sdxl"]) == ["A", "c"]
    assert names(query="BIG") == ["A"]
    assert names(categories=["user"]) == ["A", "b", "c"] and names(categories=["default"]) == []
    page = client.get(f"{WORKFLOWS}/", params={"page": 1, "per_page": 2}).json()
    assert (page["page"], page["pages"], page["per_page"], page["total"]) == (1, 2, 2, 3)
    assert [item["name"] for item in page["items"]] == ["c"]
    assert client.get(f"{WORKFLOWS}/counts_by_tag", params={"tags": ["upscale", "flux"]}).json() == {
        "upscale": 2,
        "flux": 1,
    }
    assert client.get(f"{WORKFLOWS}/counts_by_category", params={"categories": ["user", "default"]}).json() == {
        "user": 3,
        "default": 0,
    }
    assert client.get(f"{WORKFLOWS}/tags").json() == ["flux", "sdxl", "upscale"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"workflow": workflow("n" * 301)}, ["body", "workflow", "name"]),
        ({"workflow": {**workflow(), "nodes": {}}}, ["body", "workflow", "nodes"]),
        ({"workflow": {k: v for k, v in workflow().items() if k != "meta"}}, ["body", "workflow", "meta"]),
        ({"workflow": workflow(meta={"version": "3", "category": "user"})}, ["body", "workflow", "meta", "version"]),
        (
            {"workflow": workflow(meta={"version": "3.0.0", "category": "default"})},
            ["body", "workflow", "meta", "category"],
        ),
        ({}, ["body", "workflow"]),
    ],
)
def test_a_bad_workflow_is_422_naming_the_field(client: TestClient, body: dict[str, Any], loc: list[str]) -> None:
    response = client.post(f"{WORKFLOWS}/", json=body)
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]]
    assert client.get(f"{WORKFLOWS}/").json()["total"] == 0


def test_an_update_must_name_the_path_s_workflow(client: TestClient) -> None:
    first, second = create(client), create(client, name="other")
    response = client.patch(f"{WORKFLOWS}/i/{first['workflow_id']}", json={"workflow": second["workflow"]})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "workflow", "id"]
    assert client.get(f"{WORKFLOWS}/i/{second['workflow_id']}").json()["name"] == "other"


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        ('{"workflow": %s}', None),
        ('{"workflow": {"name": "w", "nodes": [{"x": NaN}]}}', ["body", "workflow", "nodes", 0, "x"]),
        ('{"workflow": {"name": "\\udc00"}}', ["body", "workflow", "name"]),
        ('{"workflow": {"name": "w", "nodes": [{"x": 1e999}]}}', ["body", "workflow", "nodes", 0, "x"]),
    ],
)
def test_non_finite_numbers_and_lone_surrogates_are_422(client: TestClient, raw: str, loc: list[Any] | None) -> None:
    if loc is None:  # the same document, whole and well formed, is saved: the refusals below are for their values
        raw = raw % json.dumps(workflow())
    response = client.post(f"{WORKFLOWS}/", content=raw.encode(), headers={"content-type": "application/json"})
    if loc is None:
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]]


def test_a_workflow_over_the_body_limit_is_413(make_client: MakeClient) -> None:
    client = make_client(max_upload_mb=1)
    huge = workflow(notes="x" * (3 * 1024 * 1024))
    response = client.post(f"{WORKFLOWS}/", json={"workflow": huge})
    assert response.status_code == 413
    assert client.get(f"{WORKFLOWS}/").json()["total"] == 0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"per_page": 1001}, "per_page"),
        ({"page": -1}, "page"),
        ({"order_by": "size"}, "order_by"),
        ({"direction": "up"}, "direction"),
        ({"categories": "mine"}, "categories"),
        ({"query": "q" * 301}, "query"),
    ],
)
def test_bad_list_parameters_are_422_naming_them(client: TestClient, params: dict[str, Any], field: str) -> None:
    response = client.get(f"{WORKFLOWS}/", params=params)
    assert response.status_code == 422
    assert field in [error["loc"][1] for error in response.json()["detail"]]


def test_the_library_is_bounded(client: TestClient) -> None:
    client.app.state.services.workflows.max_workflows = 1  # type: ignore[attr-defined]
    create(client)
    response = client.post(f"{WORKFLOWS}/", json={"workflow": workflow()})
    assert response.status_code == 409 and "at most 1 workflows" in response.json()["detail"]
