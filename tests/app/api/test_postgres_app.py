"""The app on PostgreSQL (database_url): items run through the API as on SQLite; the settings show the lease and
hide the URL (it may hold a password); boards, images, client state and workflows through the app."""

from __future__ import annotations

import io

from api_support import QUEUE, MakeClient, enqueue, graph_json, node, wait_finished
from PIL import Image


def test_the_app_runs_items_on_postgresql_and_shows_the_lease_setting(
    make_client: MakeClient, postgres_url: str
) -> None:
    client = make_client(use_memory_db=False, database_url=postgres_url, queue_lease_seconds=9)
    config = client.get("/api/v1/app/config").json()["config"]
    assert config["queue_lease_seconds"] == 9 and config["requeue_interrupted"] is False
    assert "database_url" not in config
    response = enqueue(client, graph_json(node("n", "integer", value=3)), runs=2)
    assert response.status_code == 200, response.text
    for item_id in response.json()["item_ids"]:
        assert wait_finished(client, item_id)["status"] == "completed"
    assert client.get(f"{QUEUE}/status").json()["queue"]["completed"] == 2


def test_boards_images_client_state_and_workflows_on_postgresql(make_client: MakeClient, postgres_url: str) -> None:
    client = make_client(use_memory_db=False, database_url=postgres_url, run_processor=False)
    board = client.post("/api/v1/boards/", params={"board_name": "b"}).json()["board_id"]
    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, format="PNG")
    uploaded = client.post(
        "/api/v1/images/upload",
        params={"image_category": "user", "is_intermediate": False, "board_id": board},
        files={"file": ("a.png", png.getvalue(), "image/png")},
    ).json()
    name = uploaded["image_name"]
    assert uploaded["board_id"] == board
    client.post("/api/v1/images/star", json={"image_names": [name]})
    page = client.get("/api/v1/images/", params={"board_id": board, "search_term": "2", "categories": "user"}).json()
    assert [image["image_name"] for image in page["items"]] == [name] and page["items"][0]["starred"]
    assert client.get(f"/api/v1/boards/{board}").json()["asset_count"] == 1
    assert client.delete(f"/api/v1/boards/{board}").json()["deleted_board_images"] == [name]
    assert client.get("/api/v1/boards/none/image_names").json() == [name]
    client.post("/api/v1/client_state/default/set_by_key", params={"key": "k"}, json="v")
    assert client.get("/api/v1/client_state/default/get_by_key", params={"key": "k"}).json() == "v"
    workflow = {
        "name": "w",
        "author": "",
        "description": "",
        "version": "1.0.0",
        "contact": "",
        "tags": "Fast",
        "notes": "",
        "exposedFields": [],
        "meta": {"version": "3.0.0", "category": "user"},
        "nodes": [],
        "edges": [],
    }
    created = client.post("/api/v1/workflows/", json={"workflow": workflow}).json()
    listed = client.get("/api/v1/workflows/", params={"query": "fast", "order_by": "opened_at"}).json()
    assert [item["workflow_id"] for item in listed["items"]] == [created["workflow_id"]]
