"""/api/v1/boards and /api/v1/board_images as InvokeAI 6.14.2 has them: statuses, shapes (its required fields),
lists, membership, deletes with and without images, 'none' for images on no board, and bounds."""

from __future__ import annotations

import io
from typing import Any

import pytest
from fastapi.testclient import TestClient
from PIL import Image

BOARDS = "/api/v1/boards"
BOARD_IMAGES = "/api/v1/board_images"
# InvokeAI 6.14.2's BoardDTO's required fields.
BOARD_DTO_REQUIRED = {
    "board_id",
    "board_name",
    "user_id",
    "created_at",
    "updated_at",
    "cover_image_name",
    "archived",
    "image_count",
    "asset_count",
}


def create(client: TestClient, name: str = "Foxes") -> dict[str, Any]:
    response = client.post(f"{BOARDS}/", params={"board_name": name})
    assert response.status_code == 201, response.text
    board: dict[str, Any] = response.json()
    return board


def upload(client: TestClient, category: str = "general", **params: Any) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, format="PNG")
    response = client.post(
        "/api/v1/images/upload",
        params={"image_category": category, "is_intermediate": False, **params},
        files={"file": ("a.png", buffer.getvalue(), "image/png")},
    )
    assert response.status_code == 201, response.text
    name: str = response.json()["image_name"]
    return name


def test_a_board_is_created_read_renamed_and_archived(client: TestClient) -> None:
    board = create(client)
    assert BOARD_DTO_REQUIRED <= set(board)
    assert (board["board_name"], board["image_count"], board["asset_count"], board["cover_image_name"]) == (
        "Foxes",
        0,
        0,
        None,
    )
    board_id = board["board_id"]
    assert client.get(f"{BOARDS}/{board_id}").json() == board
    renamed = client.patch(f"{BOARDS}/{board_id}", json={"board_name": "Wolves", "archived": True})
    assert renamed.status_code == 201  # as InvokeAI's
    assert (renamed.json()["board_name"], renamed.json()["archived"]) == ("Wolves", True)
    assert client.get(f"{BOARDS}/", params={"all": True}).json() == []
    assert [b["board_id"] for b in client.get(f"{BOARDS}/", params={"all": True, "include_archived": True}).json()] == [
        board_id
    ]
    assert client.get(f"{BOARDS}/no-such-board").status_code == 404
    assert client.patch(f"{BOARDS}/no-such-board", json={"archived": False}).status_code == 404


@pytest.mark.parametrize(
    ("request_args", "loc"),
    [
        ({"method": "POST", "url": f"{BOARDS}/", "params": {"board_name": "x" * 301}}, ["query", "board_name"]),
        ({"method": "POST", "url": f"{BOARDS}/"}, ["query", "board_name"]),
        ({"method": "PATCH", "url": f"{BOARDS}/b", "json": {"board_name": "x" * 301}}, ["body", "board_name"]),
        ({"method": "PATCH", "url": f"{BOARDS}/b", "json": {"visibility": "public"}}, ["body", "visibility"]),
        ({"method": "PATCH", "url": f"{BOARDS}/b", "json": {"archived": "soon"}}, ["body", "archived"]),
        ({"method": "GET", "url": f"{BOARDS}/", "params": {"order_by": "size", "all": True}}, ["query", "order_by"]),
        ({"method": "GET", "url": f"{BOARDS}/", "params": {"offset": 0, "limit": 1001}}, ["query", "limit"]),
    ],
)
def test_bad_input_is_422_naming_the_field(client: TestClient, request_args: dict[str, Any], loc: list[str]) -> None:
    response = client.request(**request_args)
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]]


def test_boards_are_listed_whole_or_by_page(client: TestClient) -> None:
    made = [create(client, name)["board_id"] for name in ("b", "A", "c")]
    listed = client.get(f"{BOARDS}/", params={"all": "true"}).json()
    assert [b["board_id"] for b in listed] == made[::-1] and BOARD_DTO_REQUIRED <= set(listed[0])
    by_name = client.get(f"{BOARDS}/", params={"all": "true", "order_by": "board_name", "direction": "ASC"}).json()
    assert [b["board_name"] for b in by_name] == ["A", "b", "c"]
    page = client.get(f"{BOARDS}/", params={"offset": 1, "limit": 1}).json()
    assert (page["offset"], page["limit"], page["total"], [b["board_id"] for b in page["items"]]) == (
        1,
        1,
        3,
        [made[1]],
    )
    refused = client.get(f"{BOARDS}/", params={"offset": 1})
    assert refused.status_code == 400 and "all=true" in refused.json()["detail"]


def test_images_are_put_on_a_board_moved_and_taken_off(client: TestClient) -> None:
    a, b = create(client, "a")["board_id"], create(client, "b")["board_id"]
    image, asset = upload(client), upload(client, "user")
    added = client.post(f"{BOARD_IMAGES}/", json={"board_id": a, "image_name": image})
    assert added.status_code == 201
    assert added.json() == {"added_images": [image], "failed_images": [], "affected_boards": [a, "none"]}
    board = client.get(f"{BOARDS}/{a}").json()
    assert (board["image_count"], board["asset_count"], board["cover_image_name"]) == (1, 0, image)
    assert client.get(f"/api/v1/images/i/{image}").json()["board_id"] == a
    batch = client.post(f"{BOARD_IMAGES}/batch", json={"board_id": b, "image_names": [image, asset, "nope.png"]})
    assert batch.status_code == 201
    assert batch.json()["added_images"] == [image, asset]
    assert sorted(batch.json()["affected_boards"]) == sorted([a, b, "none"])
    assert client.get(f"{BOARDS}/{a}/image_names").json() == []
    assert client.get(f"{BOARDS}/{b}/image_names").json() == [asset, image]
    assert client.get(f"{BOARDS}/{b}/image_names", params={"categories": "user"}).json() == [asset]
    assert client.get(f"{BOARDS}/{b}").json()["asset_count"] == 1
    removed = client.request("DELETE", f"{BOARD_IMAGES}/", json={"image_name": image})
    assert removed.status_code == 201
    assert removed.json() == {"removed_images": [image], "failed_images": [], "affected_boards": ["none", b]}
    assert client.get(f"{BOARDS}/none/image_names").json() == [image]
    removed = client.post(f"{BOARD_IMAGES}/batch/delete", json={"image_names": [asset, "nope.png"]})
    assert removed.status_code == 201 and removed.json()["removed_images"] == [asset]
    assert client.get(f"{BOARDS}/{b}/image_names").json() == []


@pytest.mark.parametrize(
    ("method", "url", "body", "status"),
    [
        ("POST", f"{BOARD_IMAGES}/", {"board_id": "no-such-board", "image_name": "IMAGE"}, 404),
        ("POST", f"{BOARD_IMAGES}/", {"board_id": "BOARD", "image_name": "0" * 32 + ".png"}, 404),
        ("DELETE", f"{BOARD_IMAGES}/", {"image_name": "0" * 32 + ".png"}, 404),
        ("POST", f"{BOARD_IMAGES}/batch", {"board_id": "no-such-board", "image_names": ["IMAGE"]}, 404),
        ("POST", f"{BOARD_IMAGES}/batch", {"board_id": "BOARD", "image_names": ["x"] * 1001}, 422),
        ("POST", f"{BOARD_IMAGES}/batch/delete", {"image_names": ["x"] * 1001}, 422),
        ("POST", f"{BOARD_IMAGES}/batch/delete", {"image_names": ["x" * 256]}, 422),
        ("POST", f"{BOARD_IMAGES}/", {"board_id": "BOARD"}, 422),
    ],
)
def test_unknown_boards_and_images_and_oversized_batches_are_refused(
    client: TestClient, method: str, url: str, body: dict[str, Any], status: int
) -> None:
    board, image = create(client)["board_id"], upload(client)
    filled = {
        key: value.replace("BOARD", board).replace("IMAGE", image) if isinstance(value, str) else value
        for key, value in body.items()
    }
    filled = {
        key: [item.replace("IMAGE", image) for item in value] if isinstance(value, list) else value
        for key, value in filled.items()
    }
    response = client.request(method, url, json=filled)
    assert response.status_code == status, response.text
    if status == 422:
        assert response.json()["detail"][0]["loc"][:2] in (["body", "image_names"], ["body", "image_name"])
    assert client.get(f"{BOARDS}/{board}/image_names").json() == []


def test_a_cover_must_be_an_image_of_the_board(client: TestClient) -> None:
    board = create(client)["board_id"]
    on, off = upload(client, board_id=board), upload(client)
    upload(client, board_id=board)
    assert client.patch(f"{BOARDS}/{board}", json={"cover_image_name": on}).json()["cover_image_name"] == on
    refused = client.patch(f"{BOARDS}/{board}", json={"cover_image_name": off})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "cover_image_name"]


def test_deleting_a_board_keeps_its_images_unless_asked(client: TestClient) -> None:
    board = create(client)["board_id"]
    kept = [upload(client, board_id=board) for _ in range(2)]
    result = client.delete(f"{BOARDS}/{board}")
    assert result.status_code == 200
    answer = result.json()
    assert (answer["board_id"], sorted(answer["deleted_board_images"]), answer["deleted_images"]) == (
        board,
        sorted(kept),
        [],
    )
    assert client.get(f"{BOARDS}/{board}").status_code == 404
    assert all(client.get(f"/api/v1/images/i/{name}").json()["board_id"] is None for name in kept)
    board = create(client)["board_id"]
    gone = [upload(client, board_id=board) for _ in range(2)]
    answer = client.delete(f"{BOARDS}/{board}", params={"include_images": True}).json()
    assert (sorted(answer["deleted_images"]), answer["deleted_board_images"]) == (sorted(gone), [])
    assert all(client.get(f"/api/v1/images/i/{name}").status_code == 404 for name in gone)
    assert sorted(client.get(f"{BOARDS}/none/image_names").json()) == sorted(kept)
    assert client.delete(f"{BOARDS}/{board}").status_code == 404


def test_an_image_node_puts_its_image_on_the_board_its_board_input_names(client: TestClient) -> None:
    """InvokeAI's `board` input of image nodes: the image goes on that board; 'none' (the py-client's word) and no
    board leave it uncategorized; a board that does not exist fails the item, naming it."""
    from api_support import enqueue, wait_finished

    board = create(client, "From graphs")

    def made(board_field: Any) -> dict[str, Any]:
        node: dict[str, Any] = {"id": "b", "type": "blank_image", "width": 8, "height": 8}
        if board_field is not None:
            node["board"] = board_field
        response = enqueue(client, {"id": "g", "nodes": {"b": node}, "edges": []})
        assert response.status_code == 200, response.text
        return wait_finished(client, response.json()["item_ids"][0])

    on_board = made({"board_id": board["board_id"]})["session"]["results"]["b"]["image"]["image_name"]
    loose = made({"board_id": "none"})["session"]["results"]["b"]["image"]["image_name"]
    unset = made(None)["session"]["results"]["b"]["image"]["image_name"]
    assert client.get(f"{BOARDS}/{board['board_id']}/image_names").json() == [on_board]
    assert client.get(f"/api/v1/images/i/{on_board}").json()["board_id"] == board["board_id"]
    assert {client.get(f"/api/v1/images/i/{name}").json()["board_id"] for name in (loose, unset)} == {None}
    failed = made({"board_id": "no-such-board"})
    assert failed["status"] == "failed" and "no-such-board" in failed["error_message"]
