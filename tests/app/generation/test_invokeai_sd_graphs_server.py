"""InvokeAI's SD-1 and SDXL graphs, as its frontend builds them, through the REST API of a real `invokeai-web` on a
fresh root: enqueue_batch with the seed and prompts as batch data, the image equal to this server's own graph's
within 1/255, core_metadata in the PNG's invokeai_metadata, the canvas image kept intermediate, and the InvokeAI-shaped
docs/examples run as they are."""

from __future__ import annotations

import copy
import io
import json
import time
from typing import Any

import httpx
import numpy as np
import pytest
from invokeai_graphs import NEGATIVE, OUTPUT, PROMPT, SEED, SIZE, batch_data, identifier, sd1_graph, sdxl_graph
from PIL import Image
from server_support import FINISHED, QUEUE, example

INVOKEAI_EXAMPLES = (
    "invokeai/sd1_text_to_image",
    "invokeai/sd1_image_to_image",
    "invokeai/sdxl_text_to_image",
    "invokeai/sdxl_image_to_image",
)


def enqueue(client: httpx.Client, body: dict[str, Any]) -> int:
    response = client.post(f"{QUEUE}/enqueue_batch", json=body)
    assert response.status_code in (200, 201), response.text  # 200 is InvokeAI's
    [item_id] = response.json()["item_ids"]
    return int(item_id)


def finish(client: httpx.Client, item_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while (item := client.get(f"{QUEUE}/i/{item_id}").json())["status"] not in FINISHED:
        assert time.monotonic() < deadline, item
        time.sleep(0.1)
    assert item["status"] == "completed", (item.get("error_type"), item.get("error_message"))
    return item


def image_name(item: dict[str, Any], node_id: str) -> str:
    """The image the source node `node_id` made: results may be keyed by prepared ids (mapped back to the source
    ids by prepared_source_mapping, as InvokeAI keys them) or by the source ids."""
    session = item["session"]
    to_source = session.get("prepared_source_mapping") or {}
    found = [r for key, r in session["results"].items() if to_source.get(key, key) == node_id]
    assert len(found) == 1, session["results"].keys()
    name: str = found[0]["image"]["image_name"]
    return name


def png(client: httpx.Client, name: str) -> Image.Image:
    response = client.get(f"/api/v1/images/i/{name}/full")
    assert response.status_code == 200
    return Image.open(io.BytesIO(response.content))


def max_diff(a: Image.Image, b: Image.Image) -> int:
    assert a.size == b.size
    return int(np.abs(np.asarray(a.convert("RGB"), np.int16) - np.asarray(b.convert("RGB"), np.int16)).max())


@pytest.fixture(scope="module")
def records(client: httpx.Client) -> dict[str, dict[str, Any]]:
    return {record["name"]: record for record in client.get("/api/v2/models/").json()["models"]}


def own_sd1_body(steps: int) -> dict[str, Any]:
    """The same text to image in this server's own nodes (docs/examples/sd_text_to_image.json's shape)."""
    body = copy.deepcopy(example("sd_text_to_image"))
    nodes = body["batch"]["graph"]["nodes"]
    nodes["positive"]["prompt"], nodes["negative"]["prompt"] = PROMPT, NEGATIVE
    nodes["denoise"].update(width=SIZE, height=SIZE, steps=steps, cfg_scale=7.5, scheduler="euler", seed=SEED)
    return body


def test_invokeais_sd1_graph_through_enqueue_batch_makes_the_own_graphs_image(
    client: httpx.Client, records: dict[str, dict[str, Any]]
) -> None:
    steps = 12
    model = identifier(records["demo-sd1"], "sd-1")
    body = {
        "prepend": False,
        "batch": {
            "graph": sd1_graph(model, steps=steps),
            "runs": 1,
            "data": batch_data(),
            "origin": "canvas",
            "destination": "gallery",
        },
    }
    ours = finish(client, enqueue(client, body))
    own = finish(client, enqueue(client, own_sd1_body(steps)))
    made = png(client, image_name(ours, OUTPUT))
    assert max_diff(made, png(client, image_name(own, "decode"))) <= 1
    metadata = json.loads(made.text["invokeai_metadata"])
    assert {k: metadata[k] for k in ("seed", "positive_prompt", "negative_prompt", "steps", "scheduler")} == {
        "seed": SEED,
        "positive_prompt": PROMPT,
        "negative_prompt": NEGATIVE,
        "steps": steps,
        "scheduler": "euler",
    }
    assert metadata["model"]["key"] == records["demo-sd1"]["key"]


def test_invokeais_sdxl_graph_to_the_canvas_makes_an_intermediate_image(
    client: httpx.Client, records: dict[str, dict[str, Any]]
) -> None:
    model = identifier(records["demo-sdxl"], "sdxl")
    graph = sdxl_graph(model, steps=4)
    body = {"batch": {"graph": graph, "runs": 1, "data": batch_data(), "origin": "canvas", "destination": "canvas"}}
    item = finish(client, enqueue(client, body))
    name = image_name(item, OUTPUT)
    record = client.get(f"/api/v1/images/i/{name}").json()
    assert record["is_intermediate"] is True
    metadata = json.loads(png(client, name).text["invokeai_metadata"])
    assert (metadata["seed"], metadata["generation_mode"]) == (SEED, "sdxl_txt2img")


def test_an_unknown_scheduler_is_refused_at_enqueue_with_the_allowed_names(
    client: httpx.Client, records: dict[str, dict[str, Any]]
) -> None:
    graph = sd1_graph(identifier(records["demo-sd1"], "sd-1"))
    graph["nodes"]["denoise_latents:abc"]["scheduler"] = "no_such_sampler"
    response = client.post(f"{QUEUE}/enqueue_batch", json={"batch": {"graph": graph, "runs": 1}})
    assert response.status_code == 422
    assert all(name in response.text for name in ("scheduler", "euler", "dpmpp_2m_k", "no_such_sampler"))


@pytest.mark.parametrize("name", INVOKEAI_EXAMPLES)
def test_the_invokeai_shaped_examples_run_as_they_are(client: httpx.Client, name: str) -> None:
    body = example(name)
    item = finish(client, enqueue(client, body))
    image = png(client, image_name(item, OUTPUT))
    noise = body["batch"]["graph"]["nodes"]["noise:abc"]
    assert image.size == (noise["width"], noise["height"])
    assert json.loads(image.text["invokeai_metadata"])["seed"] == SEED


def test_invokeais_graphs_driven_over_socketio_as_its_clients_drive_them(
    server: str, records: dict[str, dict[str, Any]]
) -> None:
    """A browser-free client as InvokeAI's frontend drives one: python-socketio connected at /ws/socket.io,
    subscribed to the queue, enqueues the SD-1 and SDXL graphs, and learns of each output image from the
    invocation_complete of the output node and the item's completion from queue_item_status_changed, with no polling."""
    import threading

    import socketio

    events: list[tuple[str, dict[str, Any]]] = []
    changed = threading.Condition()

    def record(name: str) -> Any:
        def handler(data: dict[str, Any]) -> None:
            with changed:
                events.append((name, data))
                changed.notify_all()

        return handler

    sio = socketio.Client(reconnection=False)
    for name in ("invocation_complete", "queue_item_status_changed"):
        sio.on(name, record(name))
    sio.connect(server, socketio_path="/ws/socket.io", transports=["websocket"], wait_timeout=15)
    try:
        sio.call("subscribe_queue", {"queue_id": "default"}, timeout=10)
        for graph in (
            sd1_graph(identifier(records["demo-sd1"], "sd-1"), steps=4),
            sdxl_graph(identifier(records["demo-sdxl"], "sdxl"), steps=4),
        ):
            body = {"batch": {"graph": graph, "runs": 1, "data": batch_data(), "destination": "gallery"}}
            item_id = enqueue(httpx.Client(base_url=server), body)

            def finished(item_id: int = item_id) -> dict[str, Any] | None:
                return next(
                    (
                        d
                        for n, d in events
                        if n == "queue_item_status_changed" and d["item_id"] == item_id and d["status"] in FINISHED
                    ),
                    None,
                )

            with changed:
                assert changed.wait_for(finished, timeout=120), [n for n, _ in events]
            assert finished()["status"] == "completed"  # type: ignore[index]
            [output] = [
                d
                for n, d in events
                if n == "invocation_complete" and d["item_id"] == item_id and d["invocation_source_id"] == OUTPUT
            ]
            assert output["invocation"]["type"] == "l2i"
            name = output["result"]["image"]["image_name"]
            assert httpx.get(f"{server}/api/v1/images/i/{name}").json()["image_name"] == name
    finally:
        sio.disconnect()
