"""Qwen-Image through the REST API of a real `invokeai-web` on a fresh root (which installs demo-qwen-image and
demo-qwen-image-gguf at its first start), with InvokeAI's node types: the example graphs run as they are and equal
QwenImagePipeline's image on demo-qwen-image (InvokeAI's cfg_scale is the pipeline's true_cfg_scale; also at other
seeds, sizes and scales, with a negative prompt of another length and with none, and with a prompt past the 512-token
cut), the GGUF demo's is close to it, ComfyUI's three split files (diffusion model, Qwen2.5-VL text encoder, VAE)
installed through the models API make the pipeline's image, image-to-image through qwen_image_i2l equals
QwenImageImg2ImgPipeline's image, attention is counted under every Qwen-Image node type, Krea-2's latents still
decode through qwen_image_l2i (its graphs' decoder), and a Qwen-Image folder with another family's VAE is refused at
install naming the VAE class expected."""

from __future__ import annotations

import copy
import io
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from server_support import FINISHED, QUEUE, example, image_of, install_model, max_diff, models, run

EXAMPLES = ("qwen_image_text_to_image", "qwen_image_gguf_text_to_image", "qwen_image_image_to_image")
LONG_PROMPT = "a lighthouse on a rocky cliff at sunset, oil painting, " * 60


@pytest.fixture(scope="module")
def example_runs(client: httpx.Client) -> dict[str, tuple[dict[str, Any], list]]:
    return {name: run(client, example(name)) for name in EXAMPLES}


@pytest.fixture(scope="module")
def stock_pipe(client: httpx.Client) -> Any:
    import torch
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(models(client)["demo-qwen-image"]["path"], dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def stock_image(pipe: Any, body: dict[str, Any], **kwargs: Any) -> Image.Image:
    """QwenImagePipeline's image for a graph: InvokeAI's cfg_scale is the pipeline's true_cfg_scale."""
    import torch

    nodes = body["batch"]["graph"]["nodes"]
    d = nodes["denoise"]
    negative = nodes.get("negative")
    image: Image.Image = pipe(
        nodes["positive"]["prompt"],
        negative_prompt=negative["prompt"] if negative else None,
        true_cfg_scale=d["cfg_scale"],
        width=d["width"],
        height=d["height"],
        num_inference_steps=d["steps"],
        generator=torch.Generator("cpu").manual_seed(d["seed"]),
        **kwargs,
    ).images[0]
    return image


def without_negative(body: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(body)
    graph = body["batch"]["graph"]
    del graph["nodes"]["negative"]
    ends = ("source", "destination")
    graph["edges"] = [e for e in graph["edges"] if "negative" not in (e[end]["node_id"] for end in ends)]
    return body


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


def test_the_demo_model_is_installed_as_qwen_image(client: httpx.Client) -> None:
    record = models(client)["demo-qwen-image"]
    assert {k: record[k] for k in ("family", "base", "type", "format", "variant")} == {
        "family": "qwen-image",
        "base": "qwen-image",
        "type": "main",
        "format": "diffusers",
        "variant": "generate",
    }
    assert record["default_settings"]["steps"] == 50 and record["default_settings"]["cfg_scale"] == 4.0


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_makes_an_image_and_reports_every_step(
    client: httpx.Client, example_runs: dict[str, Any], name: str
) -> None:
    item, events = example_runs[name]
    denoise = example(name)["batch"]["graph"]["nodes"]["denoise"]
    assert image_of(client, item).size == (denoise["width"], denoise["height"])
    progress = [p for event, p in events if event == "invocation_progress"]
    steps = [p["step"] for p in progress]
    assert steps == list(range(1, len(steps) + 1)) and steps
    assert all(p["node_id"] == "denoise" for p in progress)


def test_attention_is_counted_under_every_qwen_image_node_type(
    client: httpx.Client, example_runs: dict[str, Any]
) -> None:
    counts = client.get("/api/v1/app/attention").json()["counts"]
    for node_type in ("qwen_image_text_encoder", "qwen_image_denoise", "qwen_image_l2i", "qwen_image_i2l"):
        assert sum(counts.get(node_type, {}).values()) > 0, (node_type, counts)


def test_the_example_equals_qwen_image_pipelines_image(
    client: httpx.Client, example_runs: dict[str, Any], stock_pipe: Any
) -> None:
    item, _ = example_runs["qwen_image_text_to_image"]
    body = example("qwen_image_text_to_image")
    assert body["batch"]["graph"]["nodes"]["negative"]["prompt"] == " "  # the pipeline's documented default
    assert max_diff(image_of(client, item), stock_image(stock_pipe, body)) <= 1


@pytest.mark.parametrize(
    ("negative", "changes"),
    [
        ("blurry, low quality, watermark", {"cfg_scale": 2.5, "seed": 49, "width": 96}),
        (None, {"cfg_scale": 4.0, "seed": 3, "height": 48, "steps": 12}),
        (" ", {"cfg_scale": 6.0, "seed": 11, "steps": 8, "prompt": LONG_PROMPT}),
    ],
    ids=["cfg-2.5-96x64", "no-negative-64x48", "over-512-tokens"],
)
def test_variants_equal_qwen_image_pipelines_image(
    client: httpx.Client, stock_pipe: Any, negative: str | None, changes: dict[str, Any]
) -> None:
    body = copy.deepcopy(example("qwen_image_text_to_image"))
    nodes = body["batch"]["graph"]["nodes"]
    if "prompt" in changes:
        nodes["positive"]["prompt"] = changes.pop("prompt")
    nodes["denoise"].update(changes)
    if negative is None:
        body = without_negative(body)
    else:
        body["batch"]["graph"]["nodes"]["negative"]["prompt"] = negative
    item, _ = run(client, body)
    assert max_diff(image_of(client, item), stock_image(stock_pipe, body)) <= 1


def test_the_gguf_demo_runs_close_to_the_full_precision_image(
    client: httpx.Client, example_runs: dict[str, Any], stock_pipe: Any
) -> None:
    record = models(client)["demo-qwen-image-gguf"]
    assert {k: record[k] for k in ("family", "base", "type", "format", "pipeline")} == {
        "family": "qwen-image",
        "base": "qwen-image",
        "type": "main",
        "format": "gguf_quantized",
        "pipeline": False,
    }
    item, _ = example_runs["qwen_image_gguf_text_to_image"]
    loader = item["session"]["results"]["loader"]
    # A lone transformer takes its text encoder, tokenizer and VAE from the pipeline it is paired with.
    assert loader["qwen_vl_encoder"]["text_encoder"]["name"] == loader["vae"]["vae"]["name"] == "demo-qwen-image"
    quantized = np.asarray(image_of(client, item), np.float32)
    full = np.asarray(stock_image(stock_pipe, example("qwen_image_gguf_text_to_image")), np.float32)
    assert np.abs(quantized - full).mean() < 8


def test_image_to_image_through_qwen_image_i2l_equals_the_img2img_pipeline(
    client: httpx.Client, stock_pipe: Any
) -> None:
    import torch
    from diffusers import QwenImageImg2ImgPipeline

    source = Image.fromarray((np.random.RandomState(3).rand(64, 96, 3) * 255).astype(np.uint8))
    buffer = io.BytesIO()
    source.save(buffer, format="PNG")
    upload = client.post(
        "/api/v1/images/upload",
        params={"image_category": "user", "is_intermediate": False},
        files={"file": ("source.png", buffer.getvalue(), "image/png")},
    )
    assert upload.status_code in (200, 201), upload.text
    body = copy.deepcopy(example("qwen_image_image_to_image"))
    graph = body["batch"]["graph"]
    del graph["nodes"]["source"]
    graph["edges"] = [e for e in graph["edges"] if e["source"]["node_id"] != "source"]
    nodes = graph["nodes"]
    nodes["encode"].update(image={"image_name": upload.json()["image_name"]}, seed=5)
    nodes["denoise"].update(seed=5, denoising_start=0.3, width=96, steps=10)
    item, _ = run(client, body)
    img2img = QwenImageImg2ImgPipeline(**stock_pipe.components)
    img2img.set_progress_bar_config(disable=True)
    theirs = img2img(
        nodes["positive"]["prompt"],
        negative_prompt=nodes["negative"]["prompt"],
        image=source,
        width=96,
        height=64,
        strength=0.7,
        true_cfg_scale=nodes["denoise"]["cfg_scale"],
        num_inference_steps=10,
        generator=torch.Generator("cpu").manual_seed(5),
    ).images[0]
    assert max_diff(image_of(client, item), theirs) <= 1


def test_comfyuis_three_split_files_run_as_demo_qwen_image(
    client: httpx.Client, stock_pipe: Any, tmp_path: Path
) -> None:
    """demo-qwen-image as ComfyUI's split download: the diffusion model (diffusers' names under
    model.diffusion_model.), the Qwen2.5-VL text encoder (text_encoders/qwen_2.5_vl_7b.safetensors: the language
    model under model., the vision tower under visual., no head) and the VAE (vae/qwen_image_vae.safetensors: Wan
    2.1's original names), each installed through the models API, make the pipeline's image with the loader naming
    each file; the encoder's tokenizer is the pipeline's whose text encoder it matches."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLForConditionalGeneration

    from invokeai.backend.families.qwen_image import component_files, layout

    folder = Path(models(client)["demo-qwen-image"]["path"])
    files = {
        "qwen-split-model": tmp_path / "qwen_image_demo_bf16.safetensors",
        "qwen-split-encoder": tmp_path / "qwen_2.5_vl_demo.safetensors",
        "qwen-split-vae": tmp_path / "qwen_image_vae.safetensors",
    }
    transformer = QwenImageTransformer2DModel.from_pretrained(folder / "transformer")
    layout.write_safetensors(transformer, files["qwen-split-model"], prefix=layout.PREFIX)
    encoder = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder / "text_encoder")
    component_files.write_comfyui_text_encoder(encoder, files["qwen-split-encoder"])
    component_files.write_comfyui_vae(AutoencoderKLQwenImage.from_pretrained(folder / "vae"), files["qwen-split-vae"])
    for name, path in files.items():
        install_model(client, path, name)
    installed = models(client)
    expected = {"qwen-split-model": "main", "qwen-split-encoder": "qwen_vl_encoder", "qwen-split-vae": "vae"}
    for name, kind in expected.items():
        record = installed[name]
        assert (record["family"], record["type"], record["format"], record["config_variant"]) == (
            "qwen-image",
            kind,
            "checkpoint",
            "qwen-image-demo",
        ), name
    listed = client.get("/api/v2/models/", params={"model_type": "qwen_vl_encoder"}).json()["models"]
    assert [model["name"] for model in listed] == ["qwen-split-encoder"]
    body = copy.deepcopy(example("qwen_image_text_to_image"))
    nodes = body["batch"]["graph"]["nodes"]
    nodes["loader"].update(
        model={"name": "qwen-split-model"},
        qwen_vl_encoder_model={"name": "qwen-split-encoder"},
        vae_model={"name": "qwen-split-vae"},
    )
    nodes["denoise"].update(seed=13, steps=12)
    item, _ = run(client, body)
    loader = item["session"]["results"]["loader"]
    keys = {name: installed[name]["key"] for name in (*files, "demo-qwen-image")}
    assert loader["transformer"]["transformer"]["key"] == keys["qwen-split-model"]
    assert loader["qwen_vl_encoder"]["text_encoder"]["key"] == keys["qwen-split-encoder"]
    assert loader["qwen_vl_encoder"]["tokenizer"]["key"] == keys["demo-qwen-image"]
    assert loader["vae"]["vae"]["key"] == keys["qwen-split-vae"]
    assert max_diff(image_of(client, item), stock_image(stock_pipe, body)) <= 1
    # The text encoder file is no model to generate with: the loader says so rather than borrow a transformer.
    nodes["loader"]["model"] = {"name": "qwen-split-encoder"}
    failed = run_to_the_end(client, body)
    assert failed["status"] == "failed"
    assert "is a Qwen-Image qwen_vl_encoder without a transformer" in failed["error_message"]


def test_krea2_latents_still_decode_through_qwen_image_l2i(client: httpx.Client) -> None:
    item, _ = run(client, example("krea2_text_to_image"))
    assert image_of(client, item).size == (64, 64)
    # A VAE of a family whose graphs do not decode with it is refused, naming the families that do.
    body = copy.deepcopy(example("qwen_image_text_to_image"))
    body["batch"]["graph"]["nodes"]["decode"]["vae"] = {"vae": {"name": "demo-sd1"}}
    body["batch"]["graph"]["edges"] = [
        e for e in body["batch"]["graph"]["edges"] if e["destination"] != {"node_id": "decode", "field": "vae"}
    ]
    failed = run_to_the_end(client, body)
    assert failed["status"] == "failed"
    assert "qwen_image_l2i takes the VAE of a krea2 or qwen-image model" in failed["error_message"]


def test_a_folder_with_another_familys_vae_is_refused_naming_the_vae_expected(
    client: httpx.Client, tmp_path: Path
) -> None:
    installed = models(client)
    folder = tmp_path / "qwen-with-a-flux-vae"
    shutil.copytree(installed["demo-qwen-image"]["path"], folder)
    shutil.rmtree(folder / "vae")
    shutil.copytree(Path(installed["demo-zimage"]["path"]) / "vae", folder / "vae")
    response = client.post("/api/v2/models/install", params={"source": str(folder)}, json={"name": "qwen-flux-vae"})
    if response.status_code == 201:
        job_id = response.json()["id"]
        for _ in range(600):
            job = client.get(f"/api/v2/models/install/{job_id}").json()
            if job["status"] in ("completed", "error", "cancelled"):
                break
            time.sleep(0.1)
        assert job["status"] == "error", job
        message = f"{job.get('error_reason')} {job.get('error')}"
    else:
        message = response.text
    assert "its vae is AutoencoderKL; Qwen-Image's vae is AutoencoderKLQwenImage" in message
