"""What the OpenAPI document and docs/api.md say against what the server does: methods (Allow), nullability,
statuses; error messages without object reprs; output files under the umask; InvokeAI's node and batch fields."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import QUEUE, edge, enqueue, graph_json, node, wait_finished
from fastapi.testclient import TestClient
from PIL import Image
from web_server import LOCAL_BASE_URL

from invokeai.app.api.app_factory import create_app
from invokeai.app.api.openapi import openapi_document
from invokeai.app.config import InvokeAIAppConfig

REPO = Path(__file__).resolve().parents[3]
DOCUMENT = openapi_document()


def concrete(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", template)


@pytest.fixture(scope="module")
def idle_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("contract")
    config = InvokeAIAppConfig.located({"use_memory_db": True}, root, None)
    with TestClient(create_app(config, run_processor=False), base_url=LOCAL_BASE_URL) as client:
        yield client


@pytest.mark.parametrize("template", sorted(DOCUMENT["paths"]))
def test_a_method_a_path_lacks_is_a_405_whose_allow_is_the_documents(idle_app: TestClient, template: str) -> None:
    listed = {name.upper() for name in DOCUMENT["paths"][template]}
    for method in sorted({"OPTIONS", "HEAD", "TRACE", "PATCH", "PUT", "POST", "DELETE", "GET"} - listed):
        response = idle_app.request(method, concrete(template))
        assert response.status_code == 405, (method, response.text)
        assert set(response.headers["allow"].split(", ")) == listed, method


def test_a_path_with_several_methods_names_them_all(idle_app: TestClient) -> None:
    # Starlette names the methods of the path's first route only (GET here).
    response = idle_app.options("/api/v2/models/i/some-key")
    assert response.status_code == 405
    assert response.headers["allow"] == "DELETE, GET, PATCH"


def test_a_model_name_is_not_nullable_in_the_document_nor_on_the_server(idle_app: TestClient) -> None:
    client = idle_app
    changes = DOCUMENT["components"]["schemas"]["ModelRecordChanges"]["properties"]
    assert changes["name"]["type"] == "string" and "anyOf" not in changes["name"] and "default" not in changes["name"]
    response = client.patch("/api/v2/models/i/some-key", json={"name": None})
    assert response.status_code == 422
    assert [error["loc"] for error in response.json()["detail"]] == [["body", "name"]]
    # The description is nullable in both: null passes validation, and the key is then looked up.
    assert {"type": "null"} in changes["description"]["anyOf"]
    assert client.patch("/api/v2/models/i/some-key", json={"description": None}).status_code == 404


def statuses_in_the_document() -> set[str]:
    return {
        code for item in DOCUMENT["paths"].values() for operation in item.values() for code in operation["responses"]
    }


def test_docs_api_md_lists_every_status_the_document_names() -> None:
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    errors = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| (\d{3}) \|", errors, re.M))
    assert statuses_in_the_document() - {"200", "201", "204"} <= rows, "docs/api.md's Errors table lacks a status"
    # The statuses no operation lists (unknown paths and methods) are in both as well.
    assert {"404", "405"} <= rows and "405" in DOCUMENT["info"]["description"]


NOT_IMAGES = {
    "text": b"not an image",
    "png signature only": b"\x89PNG\r\n\x1a\n" + bytes(30),
    "truncated webp": b"RIFF\0\0\0\0WEBPVP8 ",
    "truncated png": b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10\0\0\0\x10\x08\x02\0\0\0",
}


@pytest.mark.parametrize("data", NOT_IMAGES.values(), ids=NOT_IMAGES.keys())
def test_a_refused_upload_says_why_without_object_reprs(client: TestClient, data: bytes) -> None:
    response = client.post(
        "/api/v1/images/upload",
        params={"image_category": "user", "is_intermediate": False},
        files={"file": ("a.png", data, "image/png")},
    )
    assert response.status_code == 415, response.text
    detail = response.json()["detail"]
    assert detail.startswith("not a readable image") and " object at 0x" not in detail and "<" not in detail


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_output_and_uploaded_pngs_follow_the_umask(client: TestClient, tmp_path: Path, umask_022: None) -> None:
    [item_id] = enqueue(client, graph_json(node("a", "blank_image", width=8, height=8, color="#00ff00"))).json()[
        "item_ids"
    ]
    name = wait_finished(client, item_id)["session"]["results"]["a"]["image"]["image_name"]
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    uploaded = client.post(
        "/api/v1/images/upload",
        params={"image_category": "user", "is_intermediate": False},
        files={"file": ("a.png", buffer.getvalue(), "image/png")},
    )
    thumbnail = client.get(f"/api/v1/images/i/{name}/thumbnail")
    assert uploaded.status_code == 201 and thumbnail.status_code == 200
    outputs = tmp_path / "outputs"
    for path in (outputs / name, outputs / uploaded.json()["image_name"], outputs / "thumbnails" / f"{name[:-4]}.webp"):
        assert oct(path.stat().st_mode & 0o777) == "0o644", path
    assert not list(outputs.glob(".tmp-*"))


def test_a_tighter_umask_is_followed_too(client: TestClient, tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        [item_id] = enqueue(client, graph_json(node("a", "blank_image", width=8, height=8))).json()["item_ids"]
        name = wait_finished(client, item_id)["session"]["results"]["a"]["image"]["image_name"]
    finally:
        os.umask(previous)
    assert oct((tmp_path / "outputs" / name).stat().st_mode & 0o777) == "0o600"


# -- InvokeAI's fields ----------------------------------------------------------------------------------------


def test_invokeai_node_and_batch_fields_are_accepted_stored_and_echoed(client: TestClient) -> None:
    graph = graph_json(
        node("f", "float", value=3.5, is_intermediate=True, use_cache=False),
        node("g", "float", value=1.0),
    )
    response = enqueue(client, graph, origin="canvas-client", destination="gallery")
    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["batch"]["origin"], answer["batch"]["destination"]) == ("canvas-client", "gallery")
    nodes = answer["batch"]["graph"]["nodes"]
    assert (nodes["f"]["is_intermediate"], nodes["f"]["use_cache"]) == (True, False)
    # As InvokeAI does: every node has both, with their defaults when not sent.
    assert (nodes["g"]["is_intermediate"], nodes["g"]["use_cache"]) == (False, True)
    item = wait_finished(client, answer["item_ids"][0])
    assert item["status"] == "completed"
    assert (item["origin"], item["destination"]) == ("canvas-client", "gallery")
    stored = item["session"]["graph"]["nodes"]["f"]
    assert (stored["is_intermediate"], stored["use_cache"]) == (True, False)
    listed = client.get(f"{QUEUE}/list").json()["items"][0]
    assert (listed["origin"], listed["destination"]) == ("canvas-client", "gallery")


def test_without_origin_and_destination_they_are_null(client: TestClient) -> None:
    answer = enqueue(client, graph_json(node("f", "float", value=1.0))).json()
    item = client.get(f"{QUEUE}/i/{answer['item_ids'][0]}").json()
    assert (item["origin"], item["destination"]) == (None, None)


def test_is_intermediate_and_use_cache_are_not_inputs(client: TestClient) -> None:
    graph = graph_json(
        node("b", "boolean", value=True),
        node("f", "float", value=1.0),
        edges=[edge("b", "value", "f", "use_cache")],
    )
    response = enqueue(client, graph)
    assert response.status_code == 422
    assert "no input 'use_cache'" in response.text
    wrong = enqueue(client, graph_json(node("f", "float", value=1.0, is_intermediate="sometimes")))
    assert wrong.status_code == 422


def test_every_node_schema_has_the_invokeai_fields() -> None:
    schemas = DOCUMENT["components"]["schemas"]
    for name, schema in schemas.items():
        if name.endswith("Invocation"):
            assert {"is_intermediate", "use_cache"} <= set(schema["properties"]), name
    assert {"origin", "destination"} <= set(schemas["Batch"]["properties"])
    assert {"origin", "destination"} <= set(schemas["SessionQueueItem"]["properties"])
