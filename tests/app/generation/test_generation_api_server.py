"""The documented example graphs through the REST API of a real `invokeai-web` on a fresh root (which installs the
demo models at its first start): each completes with an image of the requested size, the denoisers stream their
steps, attention calls are counted under every node type that attends, a cancel stops a denoise part way, and a
model of the wrong family fails its item with a message that says so."""

from __future__ import annotations

import base64
import copy
import io
import json
import time
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse
from PIL import Image
from server_support import FINISHED, QUEUE, cancel_mid_denoise, enqueue, example, item_of

from invokeai.backend.families.registry import FAMILIES

EXAMPLES = ("sd_text_to_image", "sd_image_to_image", "krea2_text_to_image", "krea2_gguf_text_to_image")
# Every node type that runs attention in the examples: text encoders, denoisers, VAE coders.
ATTENDING_NODES = (
    "sd_text_encoder",
    "sd_denoise",
    "sd_vae_encode",
    "sd_vae_decode",
    "krea2_text_encoder",
    "krea2_denoise",
    "qwen_image_l2i",
)


@pytest.fixture(scope="module")
def example_runs(server: str) -> dict[str, tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]]:
    """Every example enqueued as it is, then run: example -> (the finished item, its events in order)."""
    with httpx.Client(base_url=server, timeout=60) as client:
        with connect_sse(client, "GET", f"{QUEUE}/events") as source:
            ids = {enqueue(client, example(name)): name for name in EXAMPLES}
            events: dict[int, list[tuple[str, dict[str, Any]]]] = {item_id: [] for item_id in ids}
            waiting = set(ids)
            for sse in source.iter_sse():
                payload = json.loads(sse.data)
                if payload.get("item_id") in events:
                    events[payload["item_id"]].append((sse.event, payload))
                if sse.event == "queue_item_status_changed" and payload["status"] in FINISHED:
                    waiting.discard(payload["item_id"])
                    if not waiting:
                        break
        return {name: (item_of(client, item_id), events[item_id]) for item_id, name in ids.items()}


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_runs_as_it_is_and_makes_an_image_of_the_requested_size(
    client: httpx.Client, example_runs: dict[str, Any], name: str
) -> None:
    nodes = example(name)["batch"]["graph"]["nodes"]
    demos = {demo.name for family in FAMILIES for demo in family.demos}
    assert {node["model"]["name"] for node in nodes.values() if "model" in node} <= demos
    item, _ = example_runs[name]
    assert item["status"] == "completed", item.get("error_traceback")
    image = item["session"]["results"]["decode"]["image"]
    requested = (nodes["denoise"]["width"], nodes["denoise"]["height"])
    record = client.get(f"/api/v1/images/i/{image['image_name']}").json()
    assert (record["width"], record["height"]) == requested
    full = client.get(f"/api/v1/images/i/{image['image_name']}/full")
    with Image.open(io.BytesIO(full.content)) as png:
        assert (png.format, png.size) == ("PNG", requested)


@pytest.mark.parametrize("name", ["sd_text_to_image", "krea2_text_to_image", "krea2_gguf_text_to_image"])
def test_the_denoisers_report_every_step_with_a_small_preview(example_runs: dict[str, Any], name: str) -> None:
    _, events = example_runs[name]
    graph = example(name)["batch"]["graph"]
    denoise = graph["nodes"]["denoise"]
    progress = [payload for event, payload in events if event == "invocation_progress"]
    assert [(p["node_id"], p["step"], p["total"]) for p in progress] == [
        ("denoise", step, denoise["steps"]) for step in range(1, denoise["steps"] + 1)
    ]
    for p in progress:
        preview = p["image"]
        assert preview["dataURL"].startswith("data:image/jpeg;base64,")
        with Image.open(io.BytesIO(base64.b64decode(preview["dataURL"].split(",", 1)[1]))) as jpeg:
            # One pixel per latent cell: an eighth of the image a side, for both families' VAEs.
            assert jpeg.size == (preview["width"], preview["height"]) == (denoise["width"] // 8, denoise["height"] // 8)


def test_attention_calls_are_counted_under_every_node_type_that_attends(
    client: httpx.Client, example_runs: dict[str, Any]
) -> None:
    assert all(item["status"] == "completed" for item, _ in example_runs.values())
    counts = client.get("/api/v1/app/attention").json()["counts"]
    for node_type in ATTENDING_NODES:
        assert sum(counts.get(node_type, {}).values()) > 0, (node_type, counts)


def test_a_cancel_mid_denoise_ends_the_item_canceled(client: httpx.Client) -> None:
    item, steps_seen = cancel_mid_denoise(client, example("sd_text_to_image"))
    assert (item["status"], item["cancel_reason"]) == ("canceled", "canceled by request")
    # The denoise stopped part way: it never returned, and its steps stopped well short of the total.
    assert "denoise" not in item["session"]["results"]
    assert 3 <= steps_seen < 100


def test_a_model_of_the_wrong_family_fails_the_item_with_a_message_that_says_so(client: httpx.Client) -> None:
    body = copy.deepcopy(example("sd_text_to_image"))
    body["batch"]["graph"]["nodes"]["denoise"]["model"] = {"name": "demo-krea2"}
    item_id = enqueue(client, body)
    deadline = time.monotonic() + 60
    while (item := item_of(client, item_id))["status"] not in FINISHED:
        assert time.monotonic() < deadline, item
        time.sleep(0.05)
    assert (item["status"], item["error_type"], item["error_message"]) == (
        "failed",
        "ValueError",
        "model 'demo-krea2' is of the krea2 family; sd_denoise needs a model of the sd-1 family",
    )
    # The text encoders before it ran.
    assert set(item["session"]["results"]) == {"positive", "negative"}
