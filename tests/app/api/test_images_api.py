"""The image routes: listing, records, files with metadata, thumbnails, delete, upload limits, and path safety."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from api_support import IMAGE_GRAPH, MakeClient, enqueue, wait_finished
from fastapi.testclient import TestClient
from PIL import Image

IMAGES = "/api/v1/images"
SECRET = "top secret settings file"


def png(size: tuple[int, int] = (300, 200), color: str = "green") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def upload(client: TestClient, data: bytes, name: str = "photo.png", **params: Any) -> Any:
    query = {"image_category": "user", "is_intermediate": False, **params}
    return client.post(f"{IMAGES}/upload", params=query, files={"file": (name, data, "image/png")})


def generated(client: TestClient) -> dict[str, Any]:
    [item_id] = enqueue(client, IMAGE_GRAPH).json()["item_ids"]
    item = wait_finished(client, item_id)
    assert item["status"] == "completed"
    return item


def test_generated_images_are_listed_and_served_with_their_graph(client: TestClient) -> None:
    item = generated(client)
    name = item["session"]["results"]["resize"]["image"]["image_name"]
    page = client.get(f"{IMAGES}/", params={"limit": 1}).json()
    assert (page["offset"], page["limit"], page["total"]) == (0, 1, 2)
    assert page["items"][0]["image_name"] == name  # newest first
    record = client.get(f"{IMAGES}/i/{name}").json()
    assert (record["width"], record["height"], record["node_id"]) == (24, 16, "resize")
    assert record["session_id"] == item["session_id"] and record["origin"] == "generated"

    full = client.get(f"{IMAGES}/i/{name}/full")
    assert full.status_code == 200 and full.headers["content-type"] == "image/png"
    with Image.open(io.BytesIO(full.content)) as image:
        assert image.size == (24, 16)
        graph = json.loads(image.text["invokeai_graph"])  # type: ignore[attr-defined]
    assert graph["edges"] == IMAGE_GRAPH["edges"]


def test_thumbnails_are_at_most_256_pixels(client: TestClient) -> None:
    name = upload(client, png((1000, 400))).json()["image_name"]
    response = client.get(f"{IMAGES}/i/{name}/thumbnail")
    assert response.status_code == 200 and response.headers["content-type"] == "image/webp"
    with Image.open(io.BytesIO(response.content)) as thumbnail:
        assert thumbnail.size == (256, 102)


def test_upload_stores_a_png_under_a_server_made_name(client: TestClient) -> None:
    response = upload(client, png(), name="../../etc/evil.png")
    assert response.status_code == 201
    record = response.json()
    assert (record["width"], record["height"], record["origin"]) == (300, 200, "uploaded")
    assert record["image_name"] != "evil.png" and "/" not in record["image_name"]
    assert client.get(f"{IMAGES}/i/{record['image_name']}/full").content.startswith(b"\x89PNG\r\n\x1a\n")


def test_delete_removes_the_image(client: TestClient) -> None:
    name = upload(client, png()).json()["image_name"]
    response = client.delete(f"{IMAGES}/i/{name}")
    assert response.status_code == 200
    assert response.json() == {"deleted_images": [name], "failed_images": [], "affected_boards": ["none"]}
    for suffix in ("", "/full", "/thumbnail"):
        assert client.get(f"{IMAGES}/i/{name}{suffix}").status_code == 404
    assert client.delete(f"{IMAGES}/i/{name}").status_code == 404
    assert client.get(f"{IMAGES}/").json()["total"] == 0


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", png()[:40], b"GIF89a" + b"\x00" * 20],
    ids=["empty", "text", "truncated-png", "gif-header-only"],
)
def test_a_file_that_is_not_an_image_is_refused_with_415(client: TestClient, data: bytes, tmp_path: Path) -> None:
    response = upload(client, data)
    assert response.status_code == 415, response.text
    assert client.get(f"{IMAGES}/").json()["total"] == 0
    assert list((tmp_path / "outputs").glob("*.png")) == []


def test_an_upload_over_max_upload_mb_is_refused_with_413(make_client: MakeClient, tmp_path: Path) -> None:
    client = make_client(max_upload_mb=1)
    buffer = io.BytesIO()
    Image.new("RGB", (700, 700), "red").save(buffer, format="BMP")  # uncompressed: about 1.4 MB
    assert len(buffer.getvalue()) > 1024 * 1024
    response = upload(client, buffer.getvalue(), name="big.bmp")
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]
    assert client.get(f"{IMAGES}/").json()["total"] == 0
    assert list((tmp_path / "outputs").glob("*.png")) == []
    # Far over the limit, the body itself is cut off while it arrives.
    assert upload(client, b"\x00" * (4 * 1024 * 1024)).status_code == 413


TRAVERSALS = [
    "..%2f..%2f..%2finvokeai.yaml",
    "%2e%2e%2finvokeai.yaml",
    "..%5cinvokeai.yaml",
    "..%255c..%255cinvokeai.yaml",
    "%2e%2e",
    "invokeai.yaml",
    "%2finvokeai.yaml",
    "thumbnails",
    "..%00.png",
    "%c0%ae%c0%ae%c0%afinvokeai.yaml",
    "0123456789abcdef0123456789abcdef.png%2f..%2f..%2finvokeai.yaml",
]


@pytest.mark.parametrize("name", TRAVERSALS)
@pytest.mark.parametrize("suffix", ["", "/full", "/thumbnail"])
def test_no_name_reaches_a_file_outside_the_records(client: TestClient, tmp_path: Path, name: str, suffix: str) -> None:
    (tmp_path / "invokeai.yaml").write_text(SECRET)
    upload(client, png())
    response = client.get(f"{IMAGES}/i/{name}{suffix}")
    assert response.status_code in (400, 404, 422), response.status_code
    assert SECRET.encode() not in response.content


def test_a_valid_name_that_is_not_recorded_is_404(client: TestClient, tmp_path: Path) -> None:
    name = "0123456789abcdef0123456789abcdef.png"
    outputs = tmp_path / "outputs"
    outputs.mkdir(exist_ok=True)
    (outputs / name).write_bytes(png())  # a file without a record is never served
    for suffix in ("", "/full", "/thumbnail"):
        assert client.get(f"{IMAGES}/i/{name}{suffix}").status_code == 404
    assert client.delete(f"{IMAGES}/i/{name}").status_code == 404
