"""FLUX.1 through the REST API of a real `invokeai-web` on a fresh root (which installs demo-flux and
demo-flux-gguf at its first start), in InvokeAI 6.14.2's node shapes (flux_model_loader, flux_text_encoder,
flux_denoise, flux_vae_decode, flux_vae_encode): the example graphs run as they are and equal FluxPipeline's image
started from InvokeAI's noise (its seeded draw in half precision); a graph wired as InvokeAI's buildFLUXGraph wires
it runs through enqueue_batch and writes its metadata into the PNG; a transformer in Black Forest Labs names
installed through the models API (safetensors and GGUF) runs paired with demo-flux's text encoders and VAE;
image-to-image through flux_vae_encode equals FluxImg2ImgPipeline run on InvokeAI's start and schedule; inputs for
features this server lacks are refused naming the input."""

from __future__ import annotations

import copy
import io
import json
import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from server_support import QUEUE, cancel_mid_denoise, example, image_of, install_model, max_diff, models, run

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
        ("denoise", step, denoise["num_steps"]) for step in range(1, denoise["num_steps"] + 1)
    ]
    assert all((p["image"]["width"], p["image"]["height"]) == (8, 8) for p in progress)


def test_the_loader_names_each_part_and_the_t5_length(client: httpx.Client, example_runs: dict[str, Any]) -> None:
    item, _ = example_runs["flux_gguf_text_to_image"]
    loader = item["session"]["results"]["loader"]
    installed = models(client)
    gguf, pipeline = installed["demo-flux-gguf"]["key"], installed["demo-flux"]["key"]
    # The lone transformer's encoders and VAE come from the pipeline it is paired with; demo-flux is dev-style.
    assert (loader["transformer"]["transformer"]["key"], loader["transformer"]["transformer"]["submodel_type"]) == (
        gguf,
        "transformer",
    )
    assert [loader["clip"][k]["key"] for k in ("tokenizer", "text_encoder")] == [pipeline, pipeline]
    assert [loader["t5_encoder"][k]["submodel_type"] for k in ("tokenizer", "text_encoder")] == [
        "tokenizer_2",
        "text_encoder_2",
    ]
    assert (loader["vae"]["vae"]["key"], loader["max_seq_len"], loader["type"]) == (
        pipeline,
        512,
        "flux_model_loader_output",
    )


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


def invokeai_noise(seed: int, width: int, height: int) -> Any:
    """InvokeAI's flux_denoise noise, written down from its get_noise: 16 channels at 1/8 size, drawn in float16
    on the CPU from the seed."""
    import torch

    generator = torch.Generator("cpu").manual_seed(seed)
    return torch.randn(1, 16, height // 8, width // 8, generator=generator, dtype=torch.float16).float()


def packed(latents: Any) -> Any:
    """FluxPipeline's token layout of (1, 16, h, w) latents: 2x2 cells, channels outermost."""
    b, c, h, w = latents.shape
    return latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)


def stock_image(pipe: Any, body: dict[str, Any], **kwargs: Any) -> Image.Image:
    nodes = body["batch"]["graph"]["nodes"]
    d = nodes["denoise"]
    seed = d.get("seed", 0)
    image: Image.Image = pipe(
        nodes["prompt"]["prompt"],
        width=d["width"],
        height=d["height"],
        num_inference_steps=d["num_steps"],
        guidance_scale=d["guidance"],
        latents=packed(invokeai_noise(seed, d["width"], d["height"])),
        **kwargs,
    ).images[0]
    return image


def test_the_example_equals_flux_pipelines_image_from_invokeais_noise(
    client: httpx.Client, example_runs: dict[str, Any], stock_pipe: Any
) -> None:
    item, _ = example_runs["flux_text_to_image"]
    assert max_diff(image_of(client, item), stock_image(stock_pipe, example("flux_text_to_image"))) <= 1


SEED, PROMPT, SIZE, STEPS = 4242, "a lighthouse on a rocky cliff at sunset", 64, 8


def build_flux_graph(model: dict[str, Any], destination_fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """InvokeAI's buildFLUXGraph, text to image, as its frontend sends it: node ids with a prefix, every node
    is_intermediate and use_cache but the output, prompt and seed in primitive nodes, the loader's VAE also wired
    to flux_denoise's controlnet_vae, and the frontend's DyPE fields (off). The positive conditioning goes
    straight in (the frontend puts a collect node between)."""
    nodes: dict[str, Any] = {}
    edges: list[dict[str, Any]] = []

    def node(node_type: str, node_id: str, **fields: Any) -> str:
        nodes[node_id] = {"id": node_id, "type": node_type, "is_intermediate": True, "use_cache": True, **fields}
        return node_id

    loader = node("flux_model_loader", "flux_model_loader:g1", model=model)
    prompt = node("string", "positive_prompt:g1", value=PROMPT)
    seed = node("integer", "seed:g1", value=SEED)
    pos = node("flux_text_encoder", "flux_text_encoder:g1")
    denoise = node(
        "flux_denoise",
        "flux_denoise:g1",
        guidance=4.0,
        num_steps=STEPS,
        scheduler="euler",
        dype_preset="off",
        dype_scale=2.0,
        dype_exponent=2.0,
        denoising_start=0,
        denoising_end=1,
        width=SIZE,
        height=SIZE,
    )
    decode = node("flux_vae_decode", "canvas_output:g1", is_intermediate=False, use_cache=False)
    decode_fields = {"metadata": {"generation_mode": "flux_txt2img", "seed": SEED, "positive_prompt": PROMPT}}
    nodes[decode].update(destination_fields or decode_fields)
    for src, out, dst, into in (
        (loader, "clip", pos, "clip"),
        (loader, "t5_encoder", pos, "t5_encoder"),
        (loader, "max_seq_len", pos, "t5_max_seq_len"),
        (loader, "transformer", denoise, "transformer"),
        (loader, "vae", denoise, "controlnet_vae"),
        (loader, "vae", decode, "vae"),
        (prompt, "value", pos, "prompt"),
        (pos, "conditioning", denoise, "positive_text_conditioning"),
        (seed, "value", denoise, "seed"),
        (denoise, "latents", decode, "latents"),
    ):
        edges.append({"source": {"node_id": src, "field": out}, "destination": {"node_id": dst, "field": into}})
    graph = {"id": "flux_graph:g1", "nodes": nodes, "edges": edges}
    return {"prepend": False, "batch": {"graph": graph, "runs": 1, "origin": "canvas", "destination": "gallery"}}


def identifier(record: dict[str, Any]) -> dict[str, Any]:
    """InvokeAI's ModelIdentifierField of an installed model, as its frontend sends it."""
    return {
        "key": record["key"],
        "hash": record.get("hash") or "",
        "name": record["name"],
        "base": "flux",
        "type": record["type"],
    }


def png_text(client: httpx.Client, image_name: str) -> dict[str, str]:
    with Image.open(io.BytesIO(client.get(f"/api/v1/images/i/{image_name}/full").content)) as png:
        return dict(png.text)


def test_invokeais_flux_graph_runs_and_equals_flux_pipeline(client: httpx.Client, stock_pipe: Any) -> None:
    body = build_flux_graph(identifier(models(client)["demo-flux"]))
    item, _ = run(client, body)
    name = item["session"]["results"]["canvas_output:g1"]["image"]["image_name"]
    mine = image_of(client, item, "canvas_output:g1")
    theirs = stock_pipe(
        PROMPT,
        width=SIZE,
        height=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        latents=packed(invokeai_noise(SEED, SIZE, SIZE)),
    ).images[0]
    assert max_diff(mine, theirs) <= 1
    metadata = json.loads(png_text(client, name)["invokeai_metadata"])
    assert metadata == {"generation_mode": "flux_txt2img", "seed": SEED, "positive_prompt": PROMPT}


def _refusal(client: httpx.Client, node: str, **fields: Any) -> str:
    body = copy.deepcopy(example("flux_text_to_image"))
    body["batch"]["graph"]["nodes"][node].update(fields)
    response = client.post(f"{QUEUE}/enqueue_batch", json=body)
    assert response.status_code == 422, response.text
    return response.text


@pytest.mark.parametrize(
    ("node", "field", "value", "said"),
    [
        ("denoise", "control", {"control_model": {"key": "x"}}, "ControlNet"),
        ("denoise", "ip_adapter", [{"ip_adapter_model": {"key": "x"}}], "IP-adapter"),
        ("denoise", "redux_conditioning", {"conditioning": {"tensor_name": "x"}}, "Redux"),
        ("denoise", "kontext_conditioning", [{"image": {"image_name": "x"}}], "Kontext"),
        ("denoise", "fill_conditioning", {"image": {"image_name": "x"}}, "Fill"),
        ("denoise", "control_lora", {"lora": {"key": "x"}}, "control LoRA"),
        ("denoise", "denoise_mask", {"mask_name": "x"}, "inpainting"),
        ("denoise", "noise", {"latents_name": "x"}, "noise"),
        ("denoise", "dype_preset", "4k", "DyPE"),
        ("prompt", "mask", {"tensor_name": "x"}, "regional prompt mask"),
    ],
)
def test_inputs_for_features_this_server_lacks_are_refused_naming_them(
    client: httpx.Client, node: str, field: str, value: Any, said: str
) -> None:
    text = _refusal(client, node, **{field: value})
    assert field in text and said in text and "not supported" in text


def test_empty_feature_inputs_and_the_frontends_dype_fields_are_accepted(client: httpx.Client) -> None:
    body = copy.deepcopy(example("flux_text_to_image"))
    body["batch"]["graph"]["nodes"]["denoise"].update(
        num_steps=1, control=None, ip_adapter=[], kontext_conditioning=None, dype_preset="off", dype_scale=2.0
    )
    run(client, body)


def test_cfg_scale_with_a_negative_prompt_changes_the_image_and_without_one_fails_clearly(client: httpx.Client) -> None:
    body = copy.deepcopy(example("flux_text_to_image"))
    graph = body["batch"]["graph"]
    graph["nodes"]["denoise"]["num_steps"] = 2
    plain, _ = run(client, body)
    graph["nodes"]["negative"] = {"id": "negative", "type": "flux_text_encoder", "prompt": "blurry"}
    for out, into in (("clip", "clip"), ("t5_encoder", "t5_encoder"), ("max_seq_len", "t5_max_seq_len")):
        graph["edges"].append(
            {"source": {"node_id": "loader", "field": out}, "destination": {"node_id": "negative", "field": into}}
        )
    graph["edges"].append(
        {
            "source": {"node_id": "negative", "field": "conditioning"},
            "destination": {"node_id": "denoise", "field": "negative_text_conditioning"},
        }
    )
    graph["nodes"]["denoise"]["cfg_scale"] = 3.0
    guided, _ = run(client, body)
    assert max_diff(image_of(client, plain), image_of(client, guided)) > 1


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
    # The loader names the lone transformer; its pair provides the encoders and VAE.
    body["batch"]["graph"]["nodes"]["loader"]["model"] = {"name": "flux-bfl"}
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
    body["batch"]["graph"]["nodes"]["loader"]["model"] = {"name": "flux-q8"}
    item, _ = run(client, body)
    quantized = np.asarray(image_of(client, item), np.float32)
    full = np.asarray(stock_image(stock_pipe, body), np.float32)
    assert np.abs(quantized - full).mean() < 8


def invokeai_schedule(steps: int, tokens: int, start: float) -> list[float]:
    """InvokeAI's FLUX dev schedule, written down from its sampling utils: steps + 1 times from 1 to 0 shifted by
    mu (linear in the image tokens), cut at 1 - start (the last time at or above it becomes exactly it)."""
    mu = 0.5 + (1.15 - 0.5) / (4096 - 256) * (tokens - 256)
    times = [1 - i / steps for i in range(steps + 1)]
    shifted = [math.exp(mu) / (math.exp(mu) + (1 / t - 1)) if t > 0 else 0.0 for t in times]
    first = max(i for i, t in enumerate(shifted) if t >= 1 - start - 1e-6)
    return [1 - start, *shifted[first + 1 :]]


def test_image_to_image_through_flux_vae_encode_equals_flux_img2img_pipeline_on_invokeais_start(
    client: httpx.Client, stock_pipe: Any
) -> None:
    """FluxImg2ImgPipeline denoising InvokeAI's start (the VAE's posterior sampled with seed 0, blended with
    InvokeAI's noise at 1 - denoising_start) over InvokeAI's cut schedule (given as sigmas the pipeline's shift
    maps onto it) makes the server's image."""
    import torch
    from diffusers import FluxImg2ImgPipeline

    source = Image.fromarray((np.random.RandomState(3).rand(64, 64, 3) * 255).astype(np.uint8))
    buffer = io.BytesIO()
    source.save(buffer, format="PNG")
    upload = client.post(
        "/api/v1/images/upload",
        params={"image_category": "user", "is_intermediate": False},
        files={"file": ("source.png", buffer.getvalue(), "image/png")},
    )
    assert upload.status_code in (200, 201), upload.text
    image_name = upload.json()["image_name"]
    body = copy.deepcopy(example("flux_text_to_image"))
    graph = body["batch"]["graph"]
    graph["nodes"]["encode"] = {"id": "encode", "type": "flux_vae_encode", "image": {"image_name": image_name}}
    graph["nodes"]["denoise"].update(seed=5, denoising_start=0.3)
    graph["edges"] += [
        {"source": {"node_id": "loader", "field": "vae"}, "destination": {"node_id": "encode", "field": "vae"}},
        {
            "source": {"node_id": "encode", "field": "latents"},
            "destination": {"node_id": "denoise", "field": "latents"},
        },
    ]
    item, _ = run(client, body)
    d = graph["nodes"]["denoise"]

    vae = stock_pipe.vae
    with torch.inference_mode():
        pixels = stock_pipe.image_processor.preprocess(source)
        sample = vae.encode(pixels).latent_dist.sample(torch.Generator("cpu").manual_seed(0))
    init = (sample - vae.config.shift_factor) * vae.config.scaling_factor
    schedule = invokeai_schedule(d["num_steps"], (64 // 16) ** 2, 0.3)
    start = schedule[0] * invokeai_noise(5, 64, 64) + (1 - schedule[0]) * init
    mu = 0.5 + (1.15 - 0.5) / (4096 - 256) * ((64 // 16) ** 2 - 256)
    # The pipeline shifts the sigmas it is given by mu; these are the times it shifts onto InvokeAI's schedule.
    sigmas = [1 / (1 + math.exp(mu) * (1 / s - 1)) for s in schedule[:-1]]
    img2img = FluxImg2ImgPipeline(**stock_pipe.components)
    img2img.set_progress_bar_config(disable=True)
    theirs = img2img(
        graph["nodes"]["prompt"]["prompt"],
        image=source,
        width=64,
        height=64,
        strength=1.0,
        sigmas=sigmas,
        guidance_scale=d["guidance"],
        num_inference_steps=len(sigmas),
        latents=packed(start),
    ).images[0]
    assert max_diff(image_of(client, item), theirs) <= 1
    counts = client.get("/api/v1/app/attention").json()["counts"]
    assert sum(counts.get("flux_vae_encode", {}).values()) > 0


def test_prompt_2_reaches_t5_as_in_flux_pipeline(client: httpx.Client, stock_pipe: Any) -> None:
    body = copy.deepcopy(example("flux_text_to_image"))
    nodes = body["batch"]["graph"]["nodes"]
    nodes["prompt"]["prompt_2"] = "a red house in a green tree"
    item, _ = run(client, body)
    mine = image_of(client, item)
    assert max_diff(mine, stock_image(stock_pipe, body, prompt_2="a red house in a green tree")) <= 1
    assert max_diff(mine, stock_image(stock_pipe, example("flux_text_to_image"))) > 1


def test_a_cancel_mid_denoise_ends_the_flux_item_canceled(client: httpx.Client) -> None:
    item, steps_seen = cancel_mid_denoise(client, example("flux_text_to_image"), steps_field="num_steps")
    assert item["status"] == "canceled"
    # The denoise stopped part way: it never returned, and its steps stopped well short of the total.
    assert "denoise" not in item["session"]["results"]
    assert 3 <= steps_seen < 100
