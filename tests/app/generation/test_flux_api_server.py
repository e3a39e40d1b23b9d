"""FLUX.1 through the REST API of a real `invokeai-web` on a fresh root (which installs demo-flux and
demo-flux-gguf at its first start): the example graphs run as they are, equal FluxPipeline's image on demo-flux, and
count attention under every FLUX node type; a transformer in Black Forest Labs names installed through the models
API (safetensors and GGUF) runs paired with demo-flux's text encoders and VAE; image-to-image through
flux_vae_encode equals FluxImg2ImgPipeline's image."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from server_support import cancel_mid_denoise, example, image_of, install_model, max_diff, models, run

EXAMPLES = ("flux_text_to_image", "flux_gguf_text_to_image")


@pytest.fixture(scope="module")
def example_runs(client: httpx.Client) -> dict[str, tuple[dict[str, Any], list]]:
    return {name: run(client, example(name)) for name in EXAMPLES}


def test_the_demo_models_are_installed_as_flux(client: httpx.Client) -> None:
    installed = models(client)
    assert {k: installed["demo-flux"][k] for k in ("family", "type", "format")} == {
        "family": "flux",
        "type": "main",
        "format": "diffusers",
    }
    # InvokeAI's words: a lone transformer is a main model (without the pipeline's other parts), GGUF quantized.
    keys = ("family", "base", "type", "format", "config_variant", "pipeline")
    assert {k: installed["demo-flux-gguf"][k] for k in keys} == {
        "family": "flux",
        "base": "flux",
        "type": "main",
        "format": "gguf_quantized",
        "config_variant": "flux-demo",
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
    assert [(p["node_id"], p["step"], p["total"]) for p in progress] == [
        ("denoise", step, denoise["steps"]) for step in range(1, denoise["steps"] + 1)
    ]
    assert all((p["image"]["width"], p["image"]["height"]) == (8, 8) for p in progress)


def test_attention_is_counted_under_every_flux_node_type(client: httpx.Client, example_runs: dict[str, Any]) -> None:
    counts = client.get("/api/v1/app/attention").json()["counts"]
    for node_type in ("flux_text_encoder", "flux_denoise", "flux_vae_decode"):
        assert sum(counts.get(node_type, {}).values()) > 0, (node_type, counts)


@pytest.fixture(scope="module")
def stock_pipe(client: httpx.Client) -> Any:
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(models(client)["demo-flux"]["path"], dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def stock_image(pipe: Any, body: dict[str, Any]) -> Image.Image:
    import torch

    nodes = body["batch"]["graph"]["nodes"]
    d = nodes["denoise"]
    image: Image.Image = pipe(
        nodes["prompt"]["prompt"],
        width=d["width"],
        height=d["height"],
        num_inference_steps=d["steps"],
        guidance_scale=d["guidance"],
        generator=torch.Generator("cpu").manual_seed(d["seed"]),
    ).images[0]
    return image


def test_the_example_equals_flux_pipelines_image(
    client: httpx.Client, example_runs: dict[str, Any], stock_pipe: Any
) -> None:
    item, _ = example_runs["flux_text_to_image"]
    assert max_diff(image_of(client, item), stock_image(stock_pipe, example("flux_text_to_image"))) <= 1


@pytest.fixture(scope="module")
def bfl_checkpoint(client: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """demo-flux's own transformer written as a BFL safetensors file (with the checkpoint prefix), installed."""
    from diffusers import FluxTransformer2DModel

    from invokeai.backend.families.flux import layout

    folder = Path(models(client)["demo-flux"]["path"]) / "transformer"
    path = tmp_path_factory.mktemp("bfl") / "flux-demo-bfl.safetensors"
    layout.write_bfl_safetensors(FluxTransformer2DModel.from_pretrained(folder), path, prefix=layout.PREFIX)
    return install_model(client, path, "flux-bfl")


def test_a_bfl_single_file_installs_and_makes_demo_flux_s_image(
    client: httpx.Client, bfl_checkpoint: dict[str, Any], stock_pipe: Any
) -> None:
    assert {k: bfl_checkpoint[k] for k in ("family", "type", "format", "config_variant", "pipeline")} == {
        "family": "flux",
        "type": "main",
        "format": "checkpoint",
        "config_variant": "flux-demo",
        "pipeline": False,
    }
    body = copy.deepcopy(example("flux_text_to_image"))
    for node in body["batch"]["graph"]["nodes"].values():
        node["model"] = {"name": "flux-bfl"}  # every node: the lone transformer's pair provides the rest
    body["batch"]["graph"]["nodes"]["denoise"].update(width=96, seed=7)
    item, _ = run(client, body)
    assert max_diff(image_of(client, item), stock_image(stock_pipe, body)) <= 1


def test_a_gguf_installed_through_the_api_runs_close_to_the_full_precision_image(
    client: httpx.Client, tmp_path: Path, stock_pipe: Any
) -> None:
    from invokeai.backend.families.flux import demo

    path = tmp_path / "flux-q8.gguf"
    demo.build_gguf(path)
    record = install_model(client, path, "flux-q8")
    assert (record["format"], record["type"], record["pipeline"]) == ("gguf_quantized", "main", False)
    body = copy.deepcopy(example("flux_gguf_text_to_image"))
    body["batch"]["graph"]["nodes"]["denoise"]["model"] = {"name": "flux-q8"}
    item, _ = run(client, body)
    quantized = np.asarray(image_of(client, item), np.float32)
    full = np.asarray(stock_image(stock_pipe, body), np.float32)
    assert np.abs(quantized - full).mean() < 8


def test_image_to_image_through_flux_vae_encode_equals_flux_img2img_pipeline(
    client: httpx.Client, stock_pipe: Any, tmp_path: Path
) -> None:
    import torch
    from diffusers import FluxImg2ImgPipeline

    source = Image.fromarray((np.random.RandomState(3).rand(64, 64, 3) * 255).astype(np.uint8))
    buffer = io.BytesIO()
    source.save(buffer, format="PNG")
    upload = client.post("/api/v1/images/upload", files={"file": ("source.png", buffer.getvalue(), "image/png")})
    assert upload.status_code in (200, 201), upload.text
    image_name = upload.json()["image_name"]
    body = copy.deepcopy(example("flux_text_to_image"))
    graph = body["batch"]["graph"]
    graph["nodes"]["encode"] = {
        "id": "encode",
        "type": "flux_vae_encode",
        "model": {"name": "demo-flux"},
        "image": {"image_name": image_name},
        "seed": 5,
    }
    graph["nodes"]["denoise"].update(seed=5, denoising_strength=0.7)
    graph["edges"].append(
        {"source": {"node_id": "encode", "field": "latents"}, "destination": {"node_id": "denoise", "field": "latents"}}
    )
    item, _ = run(client, body)
    d = graph["nodes"]["denoise"]
    img2img = FluxImg2ImgPipeline(**stock_pipe.components)
    img2img.set_progress_bar_config(disable=True)
    theirs = img2img(
        graph["nodes"]["prompt"]["prompt"],
        image=source,
        width=64,
        height=64,
        strength=0.7,
        guidance_scale=d["guidance"],
        num_inference_steps=d["steps"],
        generator=torch.Generator("cpu").manual_seed(5),
    ).images[0]
    assert max_diff(image_of(client, item), theirs) <= 1
    counts = client.get("/api/v1/app/attention").json()["counts"]
    assert sum(counts.get("flux_vae_encode", {}).values()) > 0


def test_prompt_2_and_max_sequence_length_reach_t5_as_in_flux_pipeline(client: httpx.Client, stock_pipe: Any) -> None:
    import torch

    body = copy.deepcopy(example("flux_text_to_image"))
    nodes = body["batch"]["graph"]["nodes"]
    nodes["prompt"].update(prompt_2="a red house in a green tree", max_sequence_length=64)
    item, _ = run(client, body)
    d = nodes["denoise"]
    theirs = stock_pipe(
        nodes["prompt"]["prompt"],
        prompt_2="a red house in a green tree",
        max_sequence_length=64,
        width=d["width"],
        height=d["height"],
        num_inference_steps=d["steps"],
        guidance_scale=d["guidance"],
        generator=torch.Generator("cpu").manual_seed(d["seed"]),
    ).images[0]
    mine = image_of(client, item)
    assert max_diff(mine, theirs) <= 1
    assert max_diff(mine, stock_image(stock_pipe, example("flux_text_to_image"))) > 1


def test_a_cancel_mid_denoise_ends_the_flux_item_canceled(client: httpx.Client) -> None:
    item, steps_seen = cancel_mid_denoise(client, example("flux_text_to_image"))
    assert item["status"] == "canceled"
    # The denoise stopped part way: it never returned, and its steps stopped well short of the total.
    assert "denoise" not in item["session"]["results"]
    assert 3 <= steps_seen < 100
