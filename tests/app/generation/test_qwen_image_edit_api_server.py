"""Qwen-Image-Edit through the REST API of a real `invokeai-web` on a fresh root (which installs demo-qwen-image-edit
at its first start), with InvokeAI's node types: the example graph runs as it is, and on a reference image uploaded
through the API, of another size than the output, the image equals QwenImageEditPipeline's built from the same folder
(InvokeAI's cfg_scale is its true_cfg_scale); the same folder named a QwenImageEditPlusPipeline takes two reference
images and equals that pipeline's image; attention is counted under every node type of the Edit graph (text encoder,
image-to-latents, denoise, latents-to-image); a reference count the pipeline cannot take is refused naming it."""

from __future__ import annotations

import copy
import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from server_support import FINISHED, enqueue, example, image_of, install_model, item_of, max_diff, models, run

NAME = "qwen_image_edit"


def edit_pipeline(folder: str | Path, class_name: str) -> Any:
    """The stock pipeline on the folder, its processor read from the folder's processor/ files and passed in
    (transformers' Qwen2VLProcessor cannot be built without torchvision, which this venv lacks)."""
    import diffusers
    import torch

    from invokeai.backend.families.qwen_image.vision_processor import load_processor

    pipe = getattr(diffusers, class_name).from_pretrained(
        folder, processor=load_processor(Path(folder)), dtype=torch.float32, local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def stock_image(pipe: Any, body: dict[str, Any], images: list[Image.Image]) -> Image.Image:
    import torch

    nodes = body["batch"]["graph"]["nodes"]
    d = nodes["denoise"]
    negative = nodes.get("negative")
    plus = type(pipe).__name__.endswith("PlusPipeline")
    image: Image.Image = pipe(
        image=images if plus else images[0],
        prompt=nodes["positive"]["prompt"],
        negative_prompt=negative["prompt"] if negative else None,
        true_cfg_scale=d["cfg_scale"],
        width=d["width"],
        height=d["height"],
        num_inference_steps=d["steps"],
        generator=torch.Generator("cpu").manual_seed(d["seed"]),
    ).images[0]
    return image


def upload(client: httpx.Client, image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    response = client.post(
        "/api/v1/images/upload",
        params={"image_category": "user", "is_intermediate": "false"},
        files={"file": ("reference.png", buffer.getvalue(), "image/png")},
    )
    assert response.status_code in (200, 201), response.text
    name: str = response.json()["image_name"]
    return name


def noisy(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def with_references(body: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The example with these uploaded images as its references: both encoders see them, and each is encoded as a
    reference for the denoiser, in order (a collect of one qwen_image_i2l per image)."""
    body = copy.deepcopy(body)
    graph = body["batch"]["graph"]
    nodes, edges = graph["nodes"], graph["edges"]
    for node_id in ("reference", "references", "encode"):
        del nodes[node_id]
    edges[:] = [
        e
        for e in edges
        if not {e["source"]["node_id"], e["destination"]["node_id"]} & {"reference", "references", "encode"}
    ]
    for node_id in ("positive", "negative"):
        nodes[node_id]["reference_images"] = [{"image_name": name} for name in names]
    nodes["reference_latents"] = {"id": "reference_latents", "type": "collect"}
    for index, name in enumerate(names):
        encode = f"encode_{index}"
        nodes[encode] = {"id": encode, "type": "qwen_image_i2l", "reference": True, "image": {"image_name": name}}
        edges.append(
            {"source": {"node_id": "loader", "field": "vae"}, "destination": {"node_id": encode, "field": "vae"}}
        )
        edges.append(
            {
                "source": {"node_id": encode, "field": "latents"},
                "destination": {"node_id": "reference_latents", "field": "item"},
            }
        )
    edges.append(
        {
            "source": {"node_id": "reference_latents", "field": "collection"},
            "destination": {"node_id": "denoise", "field": "reference_latents"},
        }
    )
    return body


@pytest.fixture(scope="module")
def edit_folder(client: httpx.Client) -> str:
    path: str = models(client)["demo-qwen-image-edit"]["path"]
    return path


@pytest.fixture(scope="module")
def example_run(client: httpx.Client) -> tuple[dict[str, Any], list]:
    return run(client, example(NAME))


def test_the_demo_is_installed_as_a_qwen_image_edit_model(client: httpx.Client) -> None:
    record = models(client)["demo-qwen-image-edit"]
    assert {k: record[k] for k in ("family", "base", "type", "format", "variant")} == {
        "family": "qwen-image",
        "base": "qwen-image",
        "type": "main",
        "format": "diffusers",
        "variant": "edit",
    }


def test_the_example_equals_qwen_image_edit_pipelines_image(
    client: httpx.Client, example_run: tuple[dict[str, Any], list], edit_folder: str
) -> None:
    item, _ = example_run
    body = example(NAME)
    source = body["batch"]["graph"]["nodes"]["reference"]
    color = source["color"]
    reference = Image.new("RGB", (source["width"], source["height"]), (color["r"], color["g"], color["b"]))
    assert reference.size != (body["batch"]["graph"]["nodes"]["denoise"]["width"],) * 2
    mine = image_of(client, item)
    assert max_diff(mine, stock_image(edit_pipeline(edit_folder, "QwenImageEditPipeline"), body, [reference])) <= 1


def test_an_uploaded_reference_of_another_size_equals_the_pipelines_image(
    client: httpx.Client, edit_folder: str
) -> None:
    reference = noisy(80, 112, 1)  # portrait, while the output is landscape
    body = with_references(example(NAME), [upload(client, reference)])
    denoise = body["batch"]["graph"]["nodes"]["denoise"]
    denoise.update(width=96, height=64, seed=7, cfg_scale=2.5, steps=2)
    body["batch"]["graph"]["nodes"]["negative"]["prompt"] = "blurry, low quality"
    item, _ = run(client, body)
    stock = stock_image(edit_pipeline(edit_folder, "QwenImageEditPipeline"), body, [reference])
    assert max_diff(image_of(client, item), stock) <= 1


def test_edit_plus_takes_two_reference_images(client: httpx.Client, edit_folder: str, tmp_path: Path) -> None:
    folder = tmp_path / "qwen-image-edit-plus"
    shutil.copytree(edit_folder, folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": "QwenImageEditPlusPipeline"}))
    install_model(client, folder, "test-qwen-image-edit-plus")
    references = [noisy(96, 64, 2), noisy(48, 80, 3)]
    body = with_references(example(NAME), [upload(client, image) for image in references])
    body["batch"]["graph"]["nodes"]["loader"]["model"] = {"name": "test-qwen-image-edit-plus"}
    body["batch"]["graph"]["nodes"]["denoise"].update(width=64, height=48, seed=3, steps=2)
    item, _ = run(client, body)
    stock = stock_image(edit_pipeline(folder, "QwenImageEditPlusPipeline"), body, references)
    assert max_diff(image_of(client, item), stock) <= 1


def test_attention_is_counted_under_every_node_type_of_the_edit_graph(
    client: httpx.Client, example_run: tuple[dict[str, Any], list]
) -> None:
    counts = client.get("/api/v1/app/attention").json()["counts"]
    for node_type in ("qwen_image_text_encoder", "qwen_image_i2l", "qwen_image_denoise", "qwen_image_l2i"):
        assert sum(counts.get(node_type, {}).values()) > 0, (node_type, counts)


def test_two_references_for_qwen_image_edit_are_refused_naming_edit_plus(client: httpx.Client) -> None:
    names = [upload(client, noisy(64, 64, seed)) for seed in (4, 5)]
    item_id = enqueue(client, with_references(example(NAME), names))
    deadline = time.monotonic() + 120
    while (item := item_of(client, item_id))["status"] not in FINISHED:
        assert time.monotonic() < deadline, item
        time.sleep(0.1)
    assert item["status"] == "failed"
    assert "reference_images" in item["error_message"] and "QwenImageEditPlusPipeline" in item["error_message"]


def test_reference_images_for_a_text_to_image_model_are_refused_naming_the_edit_pipelines(client: httpx.Client) -> None:
    body = with_references(example(NAME), [upload(client, noisy(64, 64, 6))])
    body["batch"]["graph"]["nodes"]["loader"]["model"] = {"name": "demo-qwen-image"}
    item_id = enqueue(client, body)
    deadline = time.monotonic() + 120
    while (item := item_of(client, item_id))["status"] not in FINISHED:
        assert time.monotonic() < deadline, item
        time.sleep(0.1)
    assert item["status"] == "failed"
    message = item["error_message"]
    assert "reference_images" in message and "QwenImagePipeline" in message and "QwenImageEditPipeline" in message
