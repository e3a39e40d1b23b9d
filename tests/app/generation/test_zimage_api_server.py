"""Z-Image through the REST API of a real `invokeai-web` on a fresh root (which installs demo-zimage and
demo-zimage-gguf at its first start), with InvokeAI's node types: the example graphs run as they are and equal
ZImagePipeline's image on demo-zimage (also with CFG over a negative prompt of another length, and a prompt over the
512-token padding), image-to-image through z_image_i2l equals ZImageImg2ImgPipeline's image, attention is counted
under every Z-Image node type, a ComfyUI single-file transformer installed through the models API runs paired with
demo-zimage's encoder and VAE, ComfyUI's three split files (diffusion model, Qwen3 text encoder, FLUX.1's ae VAE)
installed through the models API make demo-zimage's image, and a cancel stops the denoise."""

from __future__ import annotations

import copy
import io
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from server_support import (
    FINISHED,
    QUEUE,
    cancel_mid_denoise,
    example,
    image_of,
    install_model,
    max_diff,
    models,
    run,
)

EXAMPLES = ("z_image_text_to_image", "z_image_gguf_text_to_image", "z_image_image_to_image")
LONG_PROMPT = "a lighthouse on a rocky cliff at sunset, oil painting, " * 60


@pytest.fixture(scope="module")
def example_runs(client: httpx.Client) -> dict[str, tuple[dict[str, Any], list]]:
    return {name: run(client, example(name)) for name in EXAMPLES}


@pytest.fixture(scope="module")
def stock_pipe(client: httpx.Client) -> Any:
    import torch
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(models(client)["demo-zimage"]["path"], torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def stock_image(pipe: Any, body: dict[str, Any]) -> Image.Image:
    """ZImagePipeline's image for a text-to-image graph: InvokeAI's guidance_scale g is the pipeline's g - 1."""
    import torch

    nodes = body["batch"]["graph"]["nodes"]
    d = nodes["denoise"]
    negative = nodes.get("negative")
    image: Image.Image = pipe(
        nodes["positive"]["prompt"],
        negative_prompt=negative["prompt"] if negative else None,
        width=d["width"],
        height=d["height"],
        num_inference_steps=d["steps"],
        guidance_scale=d["guidance_scale"] - 1.0,
        generator=torch.Generator("cpu").manual_seed(d["seed"]),
    ).images[0]
    return image


def with_negative(body: dict[str, Any], prompt: str) -> dict[str, Any]:
    body = copy.deepcopy(body)
    graph = body["batch"]["graph"]
    graph["nodes"]["negative"] = {"id": "negative", "type": "z_image_text_encoder", "prompt": prompt}
    graph["edges"] += [
        {"source": {"node_id": "loader", "field": "qwen3_encoder"},
         "destination": {"node_id": "negative", "field": "qwen3_encoder"}},
        {"source": {"node_id": "negative", "field": "conditioning"},
         "destination": {"node_id": "denoise", "field": "negative_conditioning"}},
    ]  # fmt: skip
    return body


def test_the_demo_models_are_installed_as_z_image(client: httpx.Client) -> None:
    installed = models(client)
    assert {k: installed["demo-zimage"][k] for k in ("family", "type", "format")} == {
        "family": "z-image",
        "type": "main",
        "format": "diffusers",
    }
    assert {k: installed["demo-zimage-gguf"][k] for k in ("family", "base", "type", "format", "pipeline")} == {
        "family": "z-image",
        "base": "z-image",
        "type": "main",
        "format": "gguf_quantized",
        "pipeline": False,
    }


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_makes_an_image_and_reports_every_step(
    client: httpx.Client, example_runs: dict[str, Any], name: str
) -> None:
    item, events = example_runs[name]
    denoise = example(name)["batch"]["graph"]["nodes"]["denoise"]
    assert image_of(client, item).size == (denoise["width"], denoise["height"])
    progress = [p for event, p in events if event == "invocation_progress"]
    run_steps = [p["step"] for p in progress]
    assert run_steps == list(range(1, len(run_steps) + 1)) and run_steps
    assert all(p["node_id"] == "denoise" for p in progress)


def test_attention_is_counted_under_every_z_image_node_type(client: httpx.Client, example_runs: dict[str, Any]) -> None:
    counts = client.get("/api/v1/app/attention").json()["counts"]
    for node_type in ("z_image_text_encoder", "z_image_denoise", "z_image_l2i", "z_image_i2l"):
        assert sum(counts.get(node_type, {}).values()) > 0, (node_type, counts)


def test_the_example_equals_z_image_pipelines_image(
    client: httpx.Client, example_runs: dict[str, Any], stock_pipe: Any
) -> None:
    item, _ = example_runs["z_image_text_to_image"]
    assert max_diff(image_of(client, item), stock_image(stock_pipe, example("z_image_text_to_image"))) <= 1


@pytest.mark.parametrize(
    ("negative", "changes"),
    [
        ("blurry, low quality, and a negative prompt of another length", {"guidance_scale": 4.0, "seed": 3}),
        ("", {"guidance_scale": 2.5, "width": 96, "height": 48, "steps": 5}),
        (None, {"seed": 11, "prompt": LONG_PROMPT}),
    ],
    ids=["cfg-masked-batch", "cfg-empty-negative-96x48", "over-512-tokens"],
)
def test_variants_equal_z_image_pipelines_image(
    client: httpx.Client, stock_pipe: Any, negative: str | None, changes: dict[str, Any]
) -> None:
    body = copy.deepcopy(example("z_image_text_to_image"))
    nodes = body["batch"]["graph"]["nodes"]
    if "prompt" in changes:
        nodes["positive"]["prompt"] = changes.pop("prompt")
    nodes["denoise"].update(changes)
    if negative is not None:
        body = with_negative(body, negative)
    item, _ = run(client, body)
    assert max_diff(image_of(client, item), stock_image(stock_pipe, body)) <= 1


def test_the_gguf_demo_runs_close_to_the_full_precision_image(
    client: httpx.Client, example_runs: dict[str, Any], stock_pipe: Any
) -> None:
    item, _ = example_runs["z_image_gguf_text_to_image"]
    quantized = np.asarray(image_of(client, item), np.float32)
    full = np.asarray(stock_image(stock_pipe, example("z_image_gguf_text_to_image")), np.float32)
    assert np.abs(quantized - full).mean() < 8


def test_image_to_image_through_z_image_i2l_equals_the_img2img_pipeline(client: httpx.Client, stock_pipe: Any) -> None:
    import torch
    from diffusers import ZImageImg2ImgPipeline

    source = Image.fromarray((np.random.RandomState(3).rand(64, 64, 3) * 255).astype(np.uint8))
    buffer = io.BytesIO()
    source.save(buffer, format="PNG")
    upload = client.post(
        "/api/v1/images/upload",
        params={"image_category": "user", "is_intermediate": False},
        files={"file": ("source.png", buffer.getvalue(), "image/png")},
    )
    assert upload.status_code in (200, 201), upload.text
    body = copy.deepcopy(example("z_image_image_to_image"))
    nodes = body["batch"]["graph"]["nodes"]
    del nodes["source"]
    body["batch"]["graph"]["edges"] = [e for e in body["batch"]["graph"]["edges"] if e["source"]["node_id"] != "source"]
    nodes["encode"].update(image={"image_name": upload.json()["image_name"]}, seed=5)
    nodes["denoise"].update(seed=5, denoising_start=0.3)
    item, _ = run(client, body)
    d = nodes["denoise"]
    img2img = ZImageImg2ImgPipeline(**stock_pipe.components)
    img2img.set_progress_bar_config(disable=True)
    theirs = img2img(
        nodes["positive"]["prompt"],
        negative_prompt=nodes["negative"]["prompt"],
        image=source,
        width=64,
        height=64,
        strength=0.7,
        guidance_scale=d["guidance_scale"] - 1.0,
        num_inference_steps=d["steps"],
        generator=torch.Generator("cpu").manual_seed(5),
    ).images[0]
    assert max_diff(image_of(client, item), theirs) <= 1


def test_a_comfyui_single_file_transformer_runs_as_demo_zimage(
    client: httpx.Client, stock_pipe: Any, tmp_path: Path
) -> None:
    from diffusers import ZImageTransformer2DModel

    from invokeai.backend.families.zimage import layout

    folder = Path(models(client)["demo-zimage"]["path"]) / "transformer"
    path = tmp_path / "z-image-demo-comfy.safetensors"
    layout.write_original_safetensors(ZImageTransformer2DModel.from_pretrained(folder), path, prefix=layout.PREFIX)
    record = install_model(client, path, "zimage-comfy")
    assert {k: record[k] for k in ("family", "type", "format", "pipeline")} == {
        "family": "z-image",
        "type": "main",
        "format": "checkpoint",
        "pipeline": False,
    }
    body = copy.deepcopy(example("z_image_text_to_image"))
    loader = body["batch"]["graph"]["nodes"]["loader"]
    loader.update(model={"name": "zimage-comfy"}, qwen3_encoder_model={"name": "demo-zimage"})
    body["batch"]["graph"]["nodes"]["denoise"].update(seed=7)
    item, _ = run(client, body)
    assert max_diff(image_of(client, item), stock_image(stock_pipe, body)) <= 1


def test_comfyuis_three_split_files_run_as_demo_zimage(client: httpx.Client, stock_pipe: Any, tmp_path: Path) -> None:
    """demo-zimage as ComfyUI's split download: the diffusion model (original names under model.diffusion_model.),
    the Qwen3 text encoder (text_encoders/qwen_3_4b.safetensors: transformers' names under model.) and FLUX.1's VAE
    (vae/ae.safetensors: original LDM names), each installed through the models API, make the pipeline's image with
    the loader naming each file; the encoder's tokenizer is the pipeline's whose text encoder it matches."""
    from diffusers import AutoencoderKL, ZImageTransformer2DModel
    from transformers import Qwen3Model

    from invokeai.backend.families.flux import layout as flux_layout
    from invokeai.backend.families.zimage import layout
    from invokeai.backend.models import qwen3_encoder_file

    folder = Path(models(client)["demo-zimage"]["path"])
    files = {
        "zimage-split-model": tmp_path / "z_image_demo_bf16.safetensors",
        "zimage-split-qwen3": tmp_path / "qwen_3_4b.safetensors",
        "zimage-split-ae": tmp_path / "ae.safetensors",
    }
    transformer = ZImageTransformer2DModel.from_pretrained(folder / "transformer")
    layout.write_original_safetensors(transformer, files["zimage-split-model"], prefix=layout.PREFIX)
    encoder = Qwen3Model.from_pretrained(folder, subfolder="text_encoder")
    qwen3_encoder_file.write_comfyui_text_encoder(encoder, files["zimage-split-qwen3"])
    flux_layout.write_original_vae(AutoencoderKL.from_pretrained(folder, subfolder="vae"), files["zimage-split-ae"])
    expected = {
        "zimage-split-model": ("z-image", "main", "checkpoint", "zimage-demo"),
        "zimage-split-qwen3": ("z-image", "qwen3_encoder", "checkpoint", "zimage-demo"),
        "zimage-split-ae": ("flux", "vae", "checkpoint", "flux-demo"),
    }
    for name, path in files.items():
        install_model(client, path, name)
    installed = models(client)
    for name, kind in expected.items():
        assert tuple(installed[name][k] for k in ("family", "type", "format", "config_variant")) == kind, name
    listed = client.get("/api/v2/models/", params={"model_type": "qwen3_encoder"}).json()["models"]
    # Other modules' servers may share the root (Anima's test installs a Qwen3 encoder of its own): the filter's
    # answer holds this one and only Qwen3 encoders.
    assert "zimage-split-qwen3" in [model["name"] for model in listed]
    assert {model["type"] for model in listed} == {"qwen3_encoder"}
    body = copy.deepcopy(example("z_image_text_to_image"))
    nodes = body["batch"]["graph"]["nodes"]
    nodes["loader"].update(
        model={"name": "zimage-split-model"},
        qwen3_encoder_model={"name": "zimage-split-qwen3"},
        vae_model={"name": "zimage-split-ae"},
    )
    nodes["denoise"].update(seed=13)
    item, _ = run(client, body)
    loader = item["session"]["results"]["loader"]
    keys = {name: installed[name]["key"] for name in (*files, "demo-zimage")}
    assert loader["transformer"]["transformer"]["key"] == keys["zimage-split-model"]
    assert loader["qwen3_encoder"]["text_encoder"]["key"] == keys["zimage-split-qwen3"]
    assert loader["qwen3_encoder"]["tokenizer"]["key"] == keys["demo-zimage"]
    assert loader["vae"]["vae"]["key"] == keys["zimage-split-ae"]
    assert max_diff(image_of(client, item), stock_image(stock_pipe, body)) <= 1
    # The text encoder file is no model to generate with: the loader says so rather than borrow a transformer.
    nodes["loader"]["model"] = {"name": "zimage-split-qwen3"}
    item = run_to_the_end(client, body)
    assert item["status"] == "failed"
    assert "is a Z-Image qwen3_encoder without a transformer" in item["error_message"]


def run_to_the_end(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """Enqueue one batch and poll its item until it finishes, whatever its status."""
    response = client.post(f"{QUEUE}/enqueue_batch", json=body)
    [item_id] = response.json()["item_ids"]
    for _ in range(600):
        item: dict[str, Any] = client.get(f"{QUEUE}/i/{item_id}").json()
        if item["status"] in FINISHED:
            break
        time.sleep(0.1)
    return item


def test_a_vae_model_without_z_images_latent_channels_is_refused(client: httpx.Client) -> None:
    body = copy.deepcopy(example("z_image_text_to_image"))
    body["batch"]["graph"]["nodes"]["loader"]["vae_model"] = {"name": "demo-sd1"}
    response = client.post(f"{QUEUE}/enqueue_batch", json=body)
    [item_id] = response.json()["item_ids"]
    for _ in range(600):
        item = client.get(f"{QUEUE}/i/{item_id}").json()
        if item["status"] in FINISHED:
            break
        time.sleep(0.1)
    assert item["status"] == "failed"
    assert "4 latent channels; Z-Image's has 16" in item["error_message"]


def test_a_cancel_mid_denoise_ends_the_z_image_item_canceled(client: httpx.Client) -> None:
    item, steps_seen = cancel_mid_denoise(client, example("z_image_text_to_image"))
    assert item["status"] == "canceled"
    # The denoise stopped part way: it never returned, and its steps stopped well short of the total.
    assert "denoise" not in item["session"]["results"]
    assert 3 <= steps_seen < 100
