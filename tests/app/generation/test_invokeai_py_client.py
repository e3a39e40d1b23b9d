"""invokeai-py-client 1.1.1 (PyPI), a real InvokeAI client, against a real invokeai-web: every flow it offers that
this server can serve, as its own code drives it (no request here is written by hand)."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from invokeai_py_client import InvokeAIClient
from invokeai_py_client.workflow import WorkflowDefinition
from invokeai_release import default_workflow
from PIL import Image
from server_support import models

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def client(server: str) -> InvokeAIClient:
    return InvokeAIClient.from_url(server, timeout=30.0, max_retries=0)


def _png(size: tuple[int, int], colour: tuple[int, int, int] = (200, 30, 60)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def test_version_models_and_queue(client: InvokeAIClient, server: str) -> None:
    assert client._make_request("GET", "/app/version").json()["version"]
    # The client's list_models parses every record's base with its own enum, which lacks InvokeAI 6.14.2's newer
    # bases (z-image, krea-2): with those demos installed it fails here as it does against InvokeAI itself
    # (tests/app/models/test_model_client.py shows both sides).
    installed = models(httpx.Client(base_url=server))
    some = installed["demo-sd1"]
    got = client.dnn_model_repo.get_model_by_key(some["key"])
    assert got is not None and got.name == "demo-sd1" and got.base.value == "sd-1"
    queue = client.queue_repo.get_queue()
    status = queue.get_status()
    assert status.queue.pending >= 0 and status.queue.completed >= 0
    assert isinstance(queue.list_all(), list)


def test_boards_and_images(client: InvokeAIClient, tmp_path: Path) -> None:
    board = client.board_repo.create_board("py-client board")
    assert board.board_name == "py-client board"
    assert any(b.board_id == board.board_id for b in client.board_repo.list_boards(include_uncategorized=True))
    path = tmp_path / "upload.png"
    path.write_bytes(_png((40, 24)))
    image = board.upload_image(path)
    assert image.image_name in board.list_images()
    with Image.open(io.BytesIO(board.download_image(image.image_name))) as downloaded:
        assert downloaded.size == (40, 24)
    assert board.star_image(image.image_name) and board.unstar_image(image.image_name)
    uncategorized = client.board_repo.get_uncategorized_handle()
    loose = uncategorized.upload_image(path)
    assert loose.image_name in uncategorized.list_images()
    assert board.delete_image(image.image_name) is True
    assert image.image_name not in board.list_images()
    assert uncategorized.delete_image(loose.image_name) is True
    assert client.board_repo.delete_board(board.board_id) is True
    assert client.board_repo.get_board_by_id(board.board_id) is None


def test_socketio_connects(client: InvokeAIClient) -> None:
    async def connect() -> bool:
        sio = await asyncio.wait_for(client.connect_socketio(), 30)
        try:
            return bool(sio.connected)
        finally:
            await client.disconnect_socketio()

    assert asyncio.run(connect())


def test_invokeai_default_sd15_workflow_runs_and_the_client_maps_its_image(
    client: InvokeAIClient, server: str, invokeai_release: Path, tmp_path: Path
) -> None:
    """InvokeAI's own "Text to Image - SD1.5" workflow, as its library ships it, with the demo model picked and a
    small size and few steps set (what a user does in the UI): the client turns it into a graph, submits it, waits
    and maps its output node to the image."""
    raw: dict[str, Any] = json.loads(default_workflow(invokeai_release, "Text to Image - SD1.5").read_text())
    record = models(httpx.Client(base_url=server))["demo-sd1"]
    ids: dict[str, str] = {}
    for node in raw["nodes"]:
        data = node["data"]
        inputs = data["inputs"]
        if data["type"] == "main_model_loader":
            inputs["model"]["value"] = {k: record[k] for k in ("key", "hash", "name", "base", "type")}
        if data["type"] == "noise":
            inputs["width"]["value"] = inputs["height"]["value"] = 64
        if data["type"] == "denoise_latents":
            inputs["steps"]["value"] = 6
        if data["type"] == "compel" and inputs["prompt"].get("value"):
            ids["prompt"] = node["id"]
        if data["type"] == "l2i":
            ids["output"] = node["id"]
    # The form InvokeAI's workflow builder adds when a workflow is published: the client reads its inputs (the
    # prompt) and its outputs (the board fields of image nodes) from it.
    raw["form"] = {
        "elements": {
            "root": {"id": "root", "type": "container", "data": {"layout": "column", "children": ["prompt", "out"]}},
            "prompt": {
                "id": "prompt",
                "type": "node-field",
                "data": {"fieldIdentifier": {"nodeId": ids["prompt"], "fieldName": "prompt"}},
            },
            "out": {
                "id": "out",
                "type": "node-field",
                "data": {"fieldIdentifier": {"nodeId": ids["output"], "fieldName": "board"}},
            },
        }
    }
    workflow_file = tmp_path / "workflow.json"
    workflow_file.write_text(json.dumps(raw))
    workflow = client.workflow_repo.create_workflow(WorkflowDefinition.from_file(workflow_file))
    [prompt] = [i for i in workflow.list_inputs() if i.field_name == "prompt"]
    prompt.field.value = "a red fox in the snow"
    submitted = workflow.submit_sync()
    assert submitted["enqueued"] == 1
    item = workflow.wait_for_completion_sync(timeout=120)
    assert item["status"] == "completed", item.get("error_message")
    mappings = workflow.map_outputs_to_images(item)
    names = [name for mapping in mappings for name in mapping["image_names"]]
    assert len(names) == 1
    image = httpx.get(f"{server}/api/v1/images/i/{names[0]}/full")
    with Image.open(io.BytesIO(image.content)) as png:
        assert png.size == (64, 64)
    graph = item["session"]["graph"]["nodes"]
    assert graph[ids["prompt"]]["prompt"] == "a red fox in the snow"


def test_model_install_from_a_local_folder(client: InvokeAIClient, server: str, tmp_path: Path) -> None:
    record = models(httpx.Client(base_url=server))["demo-sd1"]
    copy = tmp_path / "sd1-copy"
    shutil.copytree(record["path"], copy)
    job = client.dnn_model_repo.install_model(
        str(copy), config={"name": "py-client-sd1", "description": "a copy of demo-sd1"}, inplace=True
    )
    info = job.wait_until(timeout=120, poll_interval=0.5)
    assert info.status.value == "completed", info
    installed = client.dnn_model_repo.get_model_by_key(info.model_key) if info.model_key else None
    assert installed is not None and installed.name == "py-client-sd1"
    assert any(j.job_id == job.job_id for j in client.dnn_model_repo.list_install_jobs())
