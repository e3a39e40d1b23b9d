"""What InvokeAI's web UI reads as it starts, beyond the resources it shares with other clients: the gallery's item
names, and the parts this server leaves out (style presets, system prompts, videos, model relationships), each
answered with InvokeAI's shape and nothing in it."""

from __future__ import annotations

import io

from fastapi.testclient import TestClient
from PIL import Image


def _upload(client: TestClient, *, is_intermediate: bool) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, format="PNG")
    response = client.post(
        "/api/v1/images/upload",
        params={"image_category": "general", "is_intermediate": str(is_intermediate).lower()},
        files={"file": ("a.png", buffer.getvalue(), "image/png")},
    )
    assert response.status_code == 201, response.text
    name: str = response.json()["image_name"]
    return name


def test_gallery_item_names_are_the_images_the_filters_select(client: TestClient) -> None:
    shown, hidden = _upload(client, is_intermediate=False), _upload(client, is_intermediate=True)
    client.post("/api/v1/images/star", json={"image_names": [shown]})
    got = client.get(
        "/api/v1/gallery/item_names",
        params={"board_id": "none", "categories": "general", "is_intermediate": "false", "starred_first": "true"},
    )
    assert got.status_code == 200
    assert got.json() == {"item_names": [shown], "starred_count": 1, "total_count": 1}
    every = client.get("/api/v1/gallery/item_names", params={"starred_first": "false"}).json()
    assert set(every["item_names"]) == {shown, hidden} and every["starred_count"] == 0
    assert client.get("/api/v1/gallery/item_names", params={"board_id": "no-such-board"}).status_code == 404


def test_left_out_parts_answer_empty(client: TestClient) -> None:
    assert client.get("/api/v1/style_presets/").json() == []
    assert client.get("/api/v1/system_prompts/").json() == []
    videos = client.get("/api/v1/videos/", params={"board_id": "none", "is_intermediate": "false", "limit": 0})
    assert videos.json() == {"items": [], "offset": 0, "limit": 0, "total": 0}
    assert client.post("/api/v1/model_relationships/batch", json={"model_keys": ["a", "b"]}).json() == []
    refused = client.post("/api/v1/model_relationships/batch", json={"model_keys": "a"})
    assert refused.status_code == 422 and "model_keys" in refused.text


def test_generation_device_options_name_this_machines_devices(client: TestClient) -> None:
    import torch

    options = client.get("/api/v1/app/generation_device_options").json()
    assert options[-1] == {"device": "cpu", "name": "CPU"}
    cuda = [o["device"] for o in options if o["device"].startswith("cuda")]
    assert cuda == [f"cuda:{i}" for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]
