"""SDXL through the REST API of a real `invokeai-web` on a fresh root (which installs demo-sdxl at its first start):
the example graphs run as they are and make StableDiffusionXLPipeline's images (also at another size, seed and
scheduler), attention is counted under every SDXL node type that attends, an unknown scheduler is refused with the
valid names, and the fp16 SGM single file of the demo installs through the models API and generates."""

from __future__ import annotations

import copy
import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from httpx_sse import connect_sse
from PIL import Image
from server_support import FINISHED, QUEUE, enqueue, example, install_model, item_of

T2I, I2I = "sdxl_text_to_image", "sdxl_image_to_image"


def run(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    item_id = enqueue(http, body)
    deadline = time.monotonic() + 120
    while (item := item_of(http, item_id))["status"] not in FINISHED:
        assert time.monotonic() < deadline, item
        time.sleep(0.05)
    assert item["status"] == "completed", item.get("error_traceback")
    return item


def image_of(http: httpx.Client, item: dict[str, Any]) -> Image.Image:
    name = item["session"]["results"]["decode"]["image"]["image_name"]
    full = http.get(f"/api/v1/images/i/{name}/full")
    with Image.open(io.BytesIO(full.content)) as png:
        assert png.format == "PNG"
        return png.convert("RGB")


def max_difference(a: Image.Image, b: Image.Image) -> int:
    assert a.size == b.size
    return int(np.abs(np.asarray(a, np.int16) - np.asarray(b.convert("RGB"), np.int16)).max())


def stock_image(pipe: Any, body: dict[str, Any], scheduler: str) -> Image.Image:
    """StableDiffusionXLPipeline's image for the graph's prompts, size, steps, guidance, seed and scheduler."""
    from invokeai.backend.families.sdxl.descriptor import FAMILY

    nodes = body["batch"]["graph"]["nodes"]
    denoise = nodes["denoise"]
    pipe.scheduler = FAMILY.make_scheduler(scheduler, dict(pipe.scheduler.config))
    negative = nodes.get("negative")
    return pipe(
        nodes["positive"]["prompt"],
        prompt_2=nodes["positive"].get("prompt_2"),
        negative_prompt=negative["prompt"] if negative else None,
        width=denoise["width"],
        height=denoise["height"],
        num_inference_steps=denoise["steps"],
        guidance_scale=denoise["cfg_scale"],
        generator=torch.Generator("cpu").manual_seed(denoise["seed"]),
    ).images[0]


@pytest.fixture(scope="module")
def records(server: str) -> dict[str, dict[str, Any]]:
    listing = httpx.get(f"{server}/api/v2/models/").json()["models"]
    return {record["name"]: record for record in listing}


@pytest.fixture(scope="module")
def demo_pipeline(records: dict[str, dict[str, Any]]) -> Any:
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(
        records["demo-sdxl"]["path"], torch_dtype=torch.float32, local_files_only=True, add_watermarker=False
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_demo_sdxl_is_installed_on_first_start(records: dict[str, dict[str, Any]]) -> None:
    record = records["demo-sdxl"]
    assert (record["family"], record["type"], record["format"]) == ("sdxl", "main", "diffusers")


def test_the_text_to_image_example_and_a_variant_make_the_pipelines_images(
    client: httpx.Client,
    demo_pipeline: Any,
) -> None:
    body = example(T2I)
    variant = copy.deepcopy(body)
    denoise = variant["batch"]["graph"]["nodes"]["denoise"]
    denoise.update(width=128, seed=denoise["seed"] + 7, scheduler="dpmpp_2m_k")
    for graph, scheduler in ((body, "euler"), (variant, "dpmpp_2m_k")):
        served = image_of(client, run(client, graph))
        nodes = graph["batch"]["graph"]["nodes"]
        assert served.size == (nodes["denoise"]["width"], nodes["denoise"]["height"])
        assert max_difference(served, stock_image(demo_pipeline, graph, scheduler)) <= 1


def test_the_image_to_image_example_runs_and_attention_is_counted_per_node_type(
    client: httpx.Client,
) -> None:
    body = example(I2I)
    served = image_of(client, run(client, body))
    denoise = body["batch"]["graph"]["nodes"]["denoise"]
    assert served.size == (denoise["width"], denoise["height"])
    run(client, example(T2I))
    counts = client.get("/api/v1/app/attention").json()["counts"]
    for node_type in ("sdxl_text_encoder", "sdxl_denoise", "sdxl_vae_decode", "sdxl_vae_encode"):
        assert sum(counts.get(node_type, {}).values()) > 0, (node_type, counts)


def test_the_denoiser_reports_every_step_with_a_preview_of_an_eighth_of_the_size(
    client: httpx.Client,
) -> None:
    body = example(T2I)
    denoise = body["batch"]["graph"]["nodes"]["denoise"]
    # Run, not taken from the invocation cache (an earlier test of this module ran the same graph).
    denoise["use_cache"] = False
    steps = []
    with connect_sse(client, "GET", f"{QUEUE}/events") as source:
        item_id = enqueue(client, body)
        for sse in source.iter_sse():
            payload = json.loads(sse.data)
            if payload.get("item_id") != item_id:
                continue
            if sse.event == "invocation_progress":
                preview = payload["image"]
                steps.append((payload["node_id"], payload["step"], payload["total"], preview["width"]))
            if sse.event == "queue_item_status_changed" and payload["status"] in FINISHED:
                break
    eighth = denoise["width"] // 8
    assert steps == [("denoise", step, denoise["steps"], eighth) for step in range(1, denoise["steps"] + 1)]


def test_an_sd1_model_in_an_sdxl_node_fails_the_item_naming_both_families(client: httpx.Client) -> None:
    body = example(T2I)
    body["batch"]["graph"]["nodes"]["denoise"]["model"] = {"name": "demo-sd1"}
    item_id = enqueue(client, body)
    deadline = time.monotonic() + 60
    while (item := item_of(client, item_id))["status"] not in FINISHED:
        assert time.monotonic() < deadline, item
        time.sleep(0.05)
    assert (item["status"], item["error_message"]) == (
        "failed",
        "model 'demo-sd1' is of the sd-1 family; sdxl_denoise needs a model of the sdxl family",
    )


def test_an_unknown_scheduler_is_refused_with_the_valid_names(client: httpx.Client) -> None:
    body = example(T2I)
    body["batch"]["graph"]["nodes"]["denoise"]["scheduler"] = "no_such_scheduler"
    response = client.post(f"{QUEUE}/enqueue_batch", json=body)
    assert response.status_code == 422
    assert all(name in response.text for name in ("euler", "euler_a", "dpmpp_2m_k"))


def test_the_fp16_single_file_installs_and_generates_the_pipelines_image(
    client: httpx.Client,
    records: dict[str, dict[str, Any]],
    tmp_path: Path,
) -> None:
    from diffusers import StableDiffusionXLPipeline

    from invokeai.backend.families import config_variant
    from invokeai.backend.families.sdxl.layout import pipeline_to_checkpoint

    file = pipeline_to_checkpoint(
        Path(records["demo-sdxl"]["path"]), tmp_path / "sdxl-demo-fp16.safetensors", dtype=torch.float16
    )
    record = install_model(client, file, "sdxl-file")
    assert (record["family"], record["type"], record["format"], record["config_variant"]) == (
        "sdxl",
        "main",
        "checkpoint",
        "sdxl-demo",
    )
    body = example(T2I)
    for node in body["batch"]["graph"]["nodes"].values():
        if "model" in node:
            node["model"] = {"name": "sdxl-file"}
    served = image_of(client, run(client, body))
    pipe = StableDiffusionXLPipeline.from_single_file(
        str(file), config=str(config_variant("sdxl-demo").path), local_files_only=True, torch_dtype=torch.float32
    )
    pipe.set_progress_bar_config(disable=True)
    assert max_difference(served, stock_image(pipe, body, "euler")) <= 1
