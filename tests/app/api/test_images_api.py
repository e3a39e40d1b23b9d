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


# -- InvokeAI 6.14.2's shapes ----------------------------------------------------------------------------------------

# InvokeAI 6.14.2's ImageDTO: its required fields, and the optional ones its clients read.
IMAGE_DTO_FIELDS = {
    "image_name",
    "image_url",
    "thumbnail_url",
    "image_origin",
    "image_category",
    "width",
    "height",
    "created_at",
    "updated_at",
    "is_intermediate",
    "starred",
    "has_workflow",
    "board_id",
    "deleted_at",
    "session_id",
    "node_id",
}


def names_of(page: dict[str, Any]) -> list[str]:
    return [image["image_name"] for image in page["items"]]


def test_an_upload_answers_invokeai_s_image_dto(client: TestClient) -> None:
    response = upload(client, png((40, 24)), image_category="control", is_intermediate=True, session_id="s1")
    assert response.status_code == 201
    dto = response.json()
    assert IMAGE_DTO_FIELDS <= set(dto)
    name = dto["image_name"]
    assert dto["image_url"] == f"api/v1/images/i/{name}/full" == response.headers["location"]
    assert dto["thumbnail_url"] == f"api/v1/images/i/{name}/thumbnail"
    assert (dto["image_origin"], dto["origin"], dto["image_category"]) == ("external", "uploaded", "control")
    assert (dto["is_intermediate"], dto["starred"], dto["has_workflow"]) == (True, False, False)
    assert (dto["board_id"], dto["session_id"], dto["deleted_at"]) == (None, "s1", None)
    assert client.get(f"{IMAGES}/i/{name}").json() == dto
    assert client.get(f"{IMAGES}/i/{name}/urls").json() == {
        "image_name": name,
        "image_url": dto["image_url"],
        "thumbnail_url": dto["thumbnail_url"],
    }
    for suffix in ("", "/urls", "/metadata", "/workflow"):
        assert client.get(f"{IMAGES}/i/{'0' * 32}.png{suffix}").status_code == 404


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"image_category": "selfie"}, "image_category"),
        ({"is_intermediate": "maybe"}, "is_intermediate"),
        ({"session_id": "s" * 256}, "session_id"),
    ],
)
def test_an_upload_with_a_bad_parameter_is_422_naming_it(
    client: TestClient, params: dict[str, Any], field: str
) -> None:
    query = {"image_category": "user", "is_intermediate": False, **params}
    response = client.post(
        f"{IMAGES}/upload",
        params={k: v for k, v in query.items() if v is not None},
        files={"file": ("a.png", png(), "image/png")},
    )
    assert response.status_code == 422
    assert ["query", field] in [error["loc"] for error in response.json()["detail"]]
    assert client.get(f"{IMAGES}/").json()["total"] == 0


def test_an_upload_without_category_is_a_users_gallery_image(client: TestClient) -> None:
    response = client.post(f"{IMAGES}/upload", files={"file": ("a.png", png(), "image/png")})
    assert response.status_code == 201
    assert (response.json()["image_category"], response.json()["is_intermediate"]) == ("user", False)


def test_an_upload_takes_invokeai_s_metadata_board_crop_and_resize(client: TestClient) -> None:
    board = client.post("/api/v1/boards/", params={"board_name": "b"}).json()["board_id"]
    response = client.post(
        f"{IMAGES}/upload",
        params={"image_category": "user", "is_intermediate": False, "board_id": board},
        files={"file": ("a.png", png(), "image/png")},
        data={"metadata": json.dumps({"positive_prompt": "a fox"}), "resize_to": '{"width": 30, "height": 20}'},
    )
    assert response.status_code == 201, response.text
    dto = response.json()
    assert (dto["board_id"], dto["width"], dto["height"]) == (board, 30, 20)
    assert client.get(f"{IMAGES}/i/{dto['image_name']}/metadata").json() == {"positive_prompt": "a fox"}
    assert client.get(f"/api/v1/boards/{board}/image_names").json() == [dto["image_name"]]
    buffer = io.BytesIO()
    clear = Image.new("RGBA", (50, 50), (0, 0, 0, 0))
    clear.paste((0, 0, 255, 255), (10, 10, 20, 15))
    clear.save(buffer, format="PNG")
    cropped = upload(client, buffer.getvalue(), crop_visible=True).json()
    assert (cropped["width"], cropped["height"]) == (10, 5)
    assert upload(client, png(), board_id="no-such-board").status_code == 404


@pytest.mark.parametrize(
    ("form", "loc"),
    [
        ({"metadata": "not json"}, ["body", "metadata"]),
        ({"metadata": "[1, 2]"}, ["body", "metadata"]),
        ({"metadata": '{"seed": NaN}'}, ["body", "metadata", "seed"]),
        ({"metadata": '{"prompt": "\\ud800"}'}, ["body", "metadata", "prompt"]),
        ({"resize_to": "[1024, 1024]"}, ["body", "resize_to"]),
        ({"resize_to": '{"width": 5000, "height": 5000}'}, ["body", "resize_to"]),
        ({"resize_to": '{"width": 0, "height": 5}'}, ["body", "resize_to"]),
    ],
)
def test_bad_upload_fields_are_422_naming_them(client: TestClient, form: dict[str, str], loc: list[str]) -> None:
    response = client.post(
        f"{IMAGES}/upload",
        params={"image_category": "user", "is_intermediate": False},
        files={"file": ("a.png", png(), "image/png")},
        data=form,
    )
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]]
    assert client.get(f"{IMAGES}/").json()["total"] == 0


def test_the_list_takes_invokeai_s_filters_and_order(client: TestClient) -> None:
    user = upload(client, png(), image_category="user").json()["image_name"]
    step = upload(client, png(), image_category="general", is_intermediate=True).json()["image_name"]
    made = generated(client)["session"]["results"]["resize"]["image"]["image_name"]
    everything = client.get(f"{IMAGES}/", params={"limit": 100}).json()
    assert set(everything) == {"items", "offset", "limit", "total"} and everything["total"] == 4
    assert IMAGE_DTO_FIELDS <= set(everything["items"][0])

    def listed(**params: Any) -> list[str]:
        response = client.get(f"{IMAGES}/", params={"limit": 100, **params})
        assert response.status_code == 200, response.text
        return names_of(response.json())

    assert step in listed(is_intermediate=True) and user not in listed(is_intermediate=True)
    assert user in listed(is_intermediate=False) and step not in listed(is_intermediate=False)
    assert listed(image_origin="external") == [step, user]
    assert made in listed(image_origin="internal") and user not in listed(image_origin="internal")
    assert listed(categories=["user"]) == [user]
    assert set(listed(categories=["user", "general"], image_origin="external")) == {user, step}
    assert listed(board_id="none", limit=1) == listed()[:1]
    assert client.get(f"{IMAGES}/", params={"board_id": "no-such-board"}).status_code == 404
    client.post(f"{IMAGES}/star", json={"image_names": [user]})
    assert listed()[0] == user
    assert listed(starred_first=False)[-1] == user
    assert listed(starred_first=False, order_dir="ASC")[0] == user
    assert client.get(f"{IMAGES}/", params={"limit": 0}).json() == {"items": [], "offset": 0, "limit": 0, "total": 4}
    assert client.get(f"{IMAGES}/").json()["limit"] == 10  # InvokeAI's default page


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 1001}, "limit"),
        ({"limit": -1}, "limit"),
        ({"offset": -1}, "offset"),
        ({"order_dir": "down"}, "order_dir"),
        ({"image_origin": "generated"}, "image_origin"),
        ({"categories": "selfie"}, "categories"),
        ({"search_term": "x" * 301}, "search_term"),
    ],
)
def test_bad_list_parameters_are_422_naming_them(client: TestClient, params: dict[str, Any], field: str) -> None:
    response = client.get(f"{IMAGES}/", params=params)
    assert response.status_code == 422
    assert field in [error["loc"][1] for error in response.json()["detail"]]


def test_names_and_images_by_names(client: TestClient) -> None:
    first, second = (upload(client, png()).json()["image_name"] for _ in range(2))
    assert client.get(f"{IMAGES}/names").json() == {
        "image_names": [second, first],
        "starred_count": 0,
        "total_count": 2,
    }
    client.post(f"{IMAGES}/star", json={"image_names": [first]})
    names = client.get(f"{IMAGES}/names", params={"order_dir": "ASC"}).json()
    assert (names["image_names"], names["starred_count"]) == ([first, second], 1)
    dtos = client.post(f"{IMAGES}/images_by_names", json={"image_names": [second, "nope.png", first]}).json()
    assert [dto["image_name"] for dto in dtos] == [second, first]
    assert IMAGE_DTO_FIELDS <= set(dtos[0])
    too_many = client.post(f"{IMAGES}/images_by_names", json={"image_names": ["x"] * 1001})
    assert too_many.status_code == 422
    assert too_many.json()["detail"][0]["loc"] == ["body", "image_names"]


def test_metadata_and_workflow_of_a_generated_image(client: TestClient) -> None:
    name = generated(client)["session"]["results"]["resize"]["image"]["image_name"]
    assert client.get(f"{IMAGES}/i/{name}/metadata").status_code == 200
    both = client.get(f"{IMAGES}/i/{name}/workflow").json()
    assert set(both) == {"workflow", "graph"} and both["workflow"] is None
    assert json.loads(both["graph"])["edges"] == IMAGE_GRAPH["edges"]
    assert client.get(f"{IMAGES}/i/{upload(client, png()).json()['image_name']}/metadata").json() is None


def test_patch_star_and_unstar(client: TestClient) -> None:
    name = upload(client, png()).json()["image_name"]
    changed = client.patch(f"{IMAGES}/i/{name}", json={"image_category": "mask", "starred": True, "board_id": "x"})
    assert changed.status_code == 200
    assert (changed.json()["image_category"], changed.json()["starred"]) == ("mask", True)
    bad = client.patch(f"{IMAGES}/i/{name}", json={"is_intermediate": "yes"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "is_intermediate"]
    assert client.patch(f"{IMAGES}/i/{'0' * 32}.png", json={"starred": True}).status_code == 404
    result = client.post(f"{IMAGES}/unstar", json={"image_names": [name, "nope.png"]}).json()
    assert result == {"unstarred_images": [name], "failed_images": [], "affected_boards": ["none"]}
    assert client.get(f"{IMAGES}/i/{name}").json()["starred"] is False
    result = client.post(f"{IMAGES}/star", json={"image_names": [name]}).json()
    assert result == {"starred_images": [name], "failed_images": [], "affected_boards": ["none"]}
    assert client.get(f"{IMAGES}/i/{name}").json()["starred"] is True


def test_delete_a_list_and_the_intermediates(client: TestClient, tmp_path: Path) -> None:
    board = client.post("/api/v1/boards/", params={"board_name": "b"}).json()["board_id"]
    kept = upload(client, png()).json()["image_name"]
    on_board = upload(client, png(), board_id=board).json()["image_name"]
    loose = upload(client, png()).json()["image_name"]
    for _ in range(2):
        upload(client, png(), is_intermediate=True)
    result = client.post(f"{IMAGES}/delete", json={"image_names": [on_board, loose, "nope.png"]}).json()
    assert result["deleted_images"] == [on_board, loose] and result["failed_images"] == []
    assert sorted(result["affected_boards"]) == sorted([board, "none"])
    assert client.get(f"{IMAGES}/intermediates").json() == 2
    assert client.delete(f"{IMAGES}/intermediates").json() == 2
    assert client.get(f"{IMAGES}/intermediates").json() == 0
    assert names_of(client.get(f"{IMAGES}/").json()) == [kept]
    assert client.get(f"/api/v1/boards/{board}").json()["image_count"] == 0
    assert len(list((tmp_path / "outputs").glob("*.png"))) == 1
