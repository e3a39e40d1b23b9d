"""Anima through the REST API of a real `invokeai-web` on a fresh root (which installs demo-anima at its first
start), with InvokeAI's node types: the example graphs run as they are and the text-to-image one equals
AnimaModularPipeline's image on demo-anima (its guider ClassifierFreeGuidance at the graph's guidance_scale; also at
another seed, size and scale with another negative prompt), image-to-image through anima_i2l equals the pipeline's
given the image, attention is counted under every Anima node type, ComfyUI's split files (the diffusion model with
its LLM adapter, the Qwen3 text encoder, the Qwen-Image VAE) installed through the models API make the pipeline's
image, and a folder or file of the wrong kind is refused at install naming what was expected."""

from __future__ import annotations

import copy
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from server_support import example, image_of, install_model, max_diff, models, run

EXAMPLES = ("anima_text_to_image", "anima_image_to_image")


@pytest.fixture(scope="module")
def example_runs(client: httpx.Client) -> dict[str, tuple[dict[str, Any], list]]:
    return {name: run(client, example(name)) for name in EXAMPLES}


@pytest.fixture(scope="module")
def stock_pipe(client: httpx.Client) -> Any:
    """The stock AnimaModularPipeline on the installed demo-anima folder."""
    import torch
    from diffusers.modular_pipelines import AnimaAutoBlocks

    folder = models(client)["demo-anima"]["path"]
    pipe = AnimaAutoBlocks().init_pipeline(folder)
    pipe.load_components(dtype=torch.float32, pretrained_model_name_or_path=folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def stock_image(pipe: Any, body: dict[str, Any], **kwargs: Any) -> Image.Image:
    import torch
    from diffusers import ClassifierFreeGuidance

    nodes = body["batch"]["graph"]["nodes"]
    d = nodes["denoise"]
    pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=d["guidance_scale"]))
    image: Image.Image = pipe(
        prompt=nodes["positive"]["prompt"],
        negative_prompt=nodes["negative"]["prompt"],
        width=d["width"],
        height=d["height"],
        num_inference_steps=d["steps"],
        generator=torch.Generator("cpu").manual_seed(d["seed"]),
        output="images",
        **kwargs,
    )[0]
    return image


def test_the_demo_model_is_installed_as_anima(client: httpx.Client) -> None:
    record = models(client)["demo-anima"]
    assert {k: record[k] for k in ("family", "base", "type", "format")} == {
        "family": "anima",
        "base": "anima",
        "type": "main",
        "format": "diffusers",
    }
    assert record["default_settings"]["steps"] == 35 and record["default_settings"]["cfg_scale"] == 4.5


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_makes_an_image_and_reports_every_step(
    client: httpx.Client, example_runs: dict[str, Any], name: str
) -> None:
    item, events = example_runs[name]
    denoise = example(name)["batch"]["graph"]["nodes"]["denoise"]
    assert image_of(client, item).size == (denoise["width"], denoise["height"])
    steps = [p["step"] for event, p in events if event == "invocation_progress" and p["node_id"] == "denoise"]
    assert steps == list(range(1, len(steps) + 1)) and steps


def test_attention_is_counted_under_every_anima_node_type(client: httpx.Client, example_runs: dict[str, Any]) -> None:
    counts = client.get("/api/v1/app/attention").json()["counts"]
    for node_type in ("anima_text_encoder", "anima_denoise", "anima_l2i", "anima_i2l"):
        assert sum(counts.get(node_type, {}).values()) > 0, (node_type, counts)


def test_the_example_and_a_variant_equal_the_modular_pipelines_image(
    client: httpx.Client, example_runs: dict[str, Any], stock_pipe: Any
) -> None:
    item, _ = example_runs["anima_text_to_image"]
    body = example("anima_text_to_image")
    assert body["batch"]["graph"]["nodes"]["negative"]["prompt"] == ""  # the pipeline's default negative prompt
    assert max_diff(image_of(client, item), stock_image(stock_pipe, body)) <= 1
    variant = copy.deepcopy(body)
    nodes = variant["batch"]["graph"]["nodes"]
    nodes["denoise"].update(width=96, height=48, seed=49, guidance_scale=3.0, steps=12)
    nodes["negative"]["prompt"] = "blurry, low quality, watermark"
    item, _ = run(client, variant)
    assert max_diff(image_of(client, item), stock_image(stock_pipe, variant)) <= 1


def test_image_to_image_equals_the_pipeline_given_the_image(
    client: httpx.Client, example_runs: dict[str, Any], stock_pipe: Any
) -> None:
    item, _ = example_runs["anima_image_to_image"]
    body = example("anima_image_to_image")
    nodes = body["batch"]["graph"]["nodes"]
    source = image_of(client, item, node="source")
    stock = stock_image(stock_pipe, body, image=source, strength=1.0 - nodes["denoise"]["denoising_start"])
    assert max_diff(image_of(client, item), stock) <= 1


def test_comfyuis_split_files_run_as_demo_anima(client: httpx.Client, stock_pipe: Any, tmp_path: Path) -> None:
    """demo-anima as ComfyUI's split download: the diffusion model (the DiT in Cosmos' names and the LLM adapter,
    under net.), the Qwen3 text encoder (under model.) and the Qwen-Image VAE (Wan 2.1's names, a qwen-image VAE
    record), installed through the models API, make the pipeline's image with the loader naming each file; the
    tokenizers and scheduler are the pipeline's whose components match."""
    from diffusers import AnimaTextConditioner, AutoencoderKLQwenImage, CosmosTransformer3DModel
    from transformers import Qwen3Model

    from invokeai.backend.families.anima import layout
    from invokeai.backend.families.qwen_image import component_files
    from invokeai.backend.models import qwen3_encoder_file

    folder = Path(models(client)["demo-anima"]["path"])
    files = {
        "anima-split-model": tmp_path / "anima-demo.safetensors",
        "anima-split-qwen3": tmp_path / "qwen_3_06b_demo.safetensors",
        "anima-split-vae": tmp_path / "qwen_image_vae.safetensors",
    }
    layout.write_safetensors(
        CosmosTransformer3DModel.from_pretrained(folder / "transformer"),
        AnimaTextConditioner.from_pretrained(folder / "text_conditioner"),
        files["anima-split-model"],
    )
    qwen3_encoder_file.write_comfyui_text_encoder(
        Qwen3Model.from_pretrained(folder / "text_encoder"), files["anima-split-qwen3"]
    )
    component_files.write_comfyui_vae(AutoencoderKLQwenImage.from_pretrained(folder / "vae"), files["anima-split-vae"])
    for name, path in files.items():
        install_model(client, path, name)
    installed = models(client)
    expected = {
        "anima-split-model": ("anima", "main", "anima-demo"),
        "anima-split-qwen3": ("anima", "qwen3_encoder", "anima-demo"),
        "anima-split-vae": ("qwen-image", "vae", "qwen-image-demo"),
    }
    for name, (family, kind, variant) in expected.items():
        record = installed[name]
        assert (record["family"], record["type"], record["format"], record["config_variant"]) == (
            family,
            kind,
            "checkpoint",
            variant,
        ), name
    body = copy.deepcopy(example("anima_text_to_image"))
    nodes = body["batch"]["graph"]["nodes"]
    nodes["loader"].update(
        model={"name": "anima-split-model"},
        qwen3_encoder_model={"name": "anima-split-qwen3"},
        vae_model={"name": "anima-split-vae"},
    )
    nodes["denoise"].update(seed=13, steps=10)
    item, _ = run(client, body)
    loader = item["session"]["results"]["loader"]
    keys = {name: installed[name]["key"] for name in (*files, "demo-anima")}
    assert loader["transformer"]["transformer"]["key"] == keys["anima-split-model"]
    assert loader["qwen3_encoder"]["text_encoder"]["key"] == keys["anima-split-qwen3"]
    assert loader["qwen3_encoder"]["tokenizer"]["key"] == keys["demo-anima"]
    assert loader["vae"]["vae"]["key"] == keys["anima-split-vae"]
    assert max_diff(image_of(client, item), stock_image(stock_pipe, body)) <= 1


def test_a_folder_with_another_familys_transformer_is_refused_naming_the_class_expected(
    client: httpx.Client, tmp_path: Path
) -> None:
    installed = models(client)
    folder = tmp_path / "swapped"
    shutil.copytree(installed["demo-anima"]["path"], folder)
    shutil.rmtree(folder / "transformer")
    shutil.copytree(Path(installed["demo-qwen-image"]["path"]) / "transformer", folder / "transformer")
    response = client.post("/api/v2/models/install", params={"source": str(folder)}, json={"name": "swapped"})
    if response.status_code == 201:
        job = response.json()
        while job["status"] not in ("completed", "error", "cancelled"):
            time.sleep(0.1)
            job = client.get(f"/api/v2/models/install/{job['id']}").json()
        assert job["status"] == "error", job
        message = f"{job.get('error_reason')} {job.get('error')}"
    else:
        message = response.text
    assert "its transformer is QwenImageTransformer2DModel; Anima's transformer is CosmosTransformer3DModel" in message
