"""InvokeAI's SD-1 and SDXL node types run in-process on the demo models (the stand-in manager of
test_generation_api_nodes): the graphs InvokeAI's frontend builds make the images this server's own sd_* / sdxl_*
graphs make, image-to-image makes what diffusers' img2img pipeline makes from the same latents and noise, a stochastic
sampler is seeded as InvokeAI seeds it, several prompts collected are joined as InvokeAI joins them, core_metadata
goes into the PNG, and what this server does not run is refused naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from invokeai_graphs import NEGATIVE, OUTPUT, PROMPT, SEED, SIZE, STEPS, filled, sd1_graph, sdxl_graph
from PIL import Image
from pydantic import ValidationError
from test_generation_api_nodes import Run, StandInManager, demo_records, max_difference, session_manager

from invokeai.app.nodes.graph import Graph

__all__ = ["demo_records", "session_manager"]  # the fixtures, imported to be found here

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def manager(session_manager: StandInManager) -> StandInManager:
    session_manager.reservations.clear()
    return session_manager


def model_of(manager: StandInManager, name: str, base: str) -> dict[str, Any]:
    record = manager.records[name]
    return {"key": record.key, "hash": record.hash or "", "name": record.name, "base": base, "type": "main"}


def own_sd1(seed: int = SEED, scheduler: str = "euler", steps: int = STEPS) -> dict[str, Any]:
    """This server's own SD-1 text-to-image graph (docs/examples/sd_text_to_image.json's shape)."""
    model = {"name": "demo-sd1"}
    return {
        "id": "own",
        "nodes": {
            "positive": {"id": "positive", "type": "sd_text_encoder", "model": model, "prompt": PROMPT},
            "negative": {"id": "negative", "type": "sd_text_encoder", "model": model, "prompt": NEGATIVE},
            "denoise": {
                "id": "denoise",
                "type": "sd_denoise",
                "model": model,
                "width": SIZE,
                "height": SIZE,
                "steps": steps,
                "cfg_scale": 7.5,
                "scheduler": scheduler,
                "seed": seed,
            },
            "decode": {"id": "decode", "type": "sd_vae_decode", "model": model},
        },
        "edges": [
            _edge("positive", "conditioning", "denoise", "positive_conditioning"),
            _edge("negative", "conditioning", "denoise", "negative_conditioning"),
            _edge("denoise", "latents", "decode", "latents"),
        ],
    }


def _edge(source: str, source_field: str, destination: str, destination_field: str) -> dict[str, Any]:
    return {
        "source": {"node_id": source, "field": source_field},
        "destination": {"node_id": destination, "field": destination_field},
    }


def png_metadata(run: Run, output: Any) -> dict[str, Any]:
    with Image.open(run.images.outputs_dir / output.image.image_name) as png:
        text: dict[str, Any] = json.loads(png.text["invokeai_metadata"])
    return text


# --- text to image equals this server's own graphs ------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["euler", "dpmpp_2m_k", "ddim"])
def test_invokeais_sd1_graph_makes_the_own_graphs_image(
    manager: StandInManager, tmp_path: Path, scheduler: str
) -> None:
    model = model_of(manager, "demo-sd1", "sd-1")
    run = Run(manager, tmp_path)
    outputs = run(filled(sd1_graph(model, scheduler=scheduler)))
    own = Run(manager, tmp_path / "own")
    expected = own.image(own(own_sd1(scheduler=scheduler))["decode"])
    assert max_difference(run.image(outputs[OUTPUT]), expected) <= 1
    # The denoise reported its steps, as sd_denoise does.
    assert [step for node, step, _, _ in run.progress if node == "denoise_latents:abc"] == list(range(1, STEPS + 1))


def test_the_png_holds_core_metadatas_values(manager: StandInManager, tmp_path: Path) -> None:
    model = model_of(manager, "demo-sd1", "sd-1")
    graph = filled(sd1_graph(model, steps=2))
    # The frontend adds fields of its own to core_metadata: kept as sent.
    graph["nodes"]["core_metadata:abc"]["canvas_v2_metadata"] = {"layers": []}
    run = Run(manager, tmp_path)
    metadata = png_metadata(run, run(graph)[OUTPUT])
    sent = graph["nodes"]["core_metadata:abc"]
    expected = {k: v for k, v in sent.items() if k not in ("id", "type", "is_intermediate", "use_cache")}
    expected.update(seed=SEED, positive_prompt=PROMPT, negative_prompt=NEGATIVE)
    assert {k: metadata[k] for k in expected} == expected
    assert metadata["model"] == model
    assert isinstance(metadata["app_version"], str)


def own_sdxl(seed: int = SEED, steps: int = STEPS) -> dict[str, Any]:
    model = {"name": "demo-sdxl"}
    return {
        "id": "own",
        "nodes": {
            "positive": {"id": "positive", "type": "sdxl_text_encoder", "model": model, "prompt": PROMPT},
            "negative": {"id": "negative", "type": "sdxl_text_encoder", "model": model, "prompt": NEGATIVE},
            "denoise": {
                "id": "denoise",
                "type": "sdxl_denoise",
                "model": model,
                "width": SIZE,
                "height": SIZE,
                "steps": steps,
                "cfg_scale": 5.0,
                "scheduler": "euler",
                "seed": seed,
            },
            "decode": {"id": "decode", "type": "sdxl_vae_decode", "model": model},
        },
        "edges": [
            _edge("positive", "conditioning", "denoise", "positive_conditioning"),
            _edge("negative", "conditioning", "denoise", "negative_conditioning"),
            _edge("denoise", "latents", "decode", "latents"),
        ],
    }


def test_invokeais_sdxl_graph_makes_the_own_graphs_image(manager: StandInManager, tmp_path: Path) -> None:
    model = model_of(manager, "demo-sdxl", "sdxl")
    run = Run(manager, tmp_path)
    image = run.image(run(filled(sdxl_graph(model)))[OUTPUT])
    own = Run(manager, tmp_path / "own")
    assert max_difference(image, own.image(own(own_sdxl())["decode"])) <= 1


def test_an_empty_sdxl_negative_prompt_is_zero_conditioning(manager: StandInManager, tmp_path: Path) -> None:
    # InvokeAI's sdxl_compel_prompt gives zeros for "", as StableDiffusionXLPipeline does without a negative prompt.
    model = model_of(manager, "demo-sdxl", "sdxl")
    run = Run(manager, tmp_path)
    image = run.image(run(filled(sdxl_graph(model), negative=""))[OUTPUT])
    own_graph = own_sdxl()
    del own_graph["nodes"]["negative"]
    own_graph["edges"] = [e for e in own_graph["edges"] if e["source"]["node_id"] != "negative"]
    own = Run(manager, tmp_path / "own")
    assert max_difference(image, own.image(own(own_graph)["decode"])) <= 1


# --- image to image -------------------------------------------------------------------------------------------


def _source_image(run: Run) -> str:
    image = Image.new("RGB", (SIZE, SIZE), (51, 102, 204))
    for x in range(0, SIZE, 8):
        image.paste((220, 40, 40), (x, 0, x + 4, SIZE))
    return run.images.save(image, origin="uploaded").image_name


def _img2img_pipeline(manager: StandInManager, xl: bool) -> Any:
    from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionXLImg2ImgPipeline

    from invokeai.backend.families.sd_schedulers import make_sd_scheduler

    record = manager.records["demo-sdxl" if xl else "demo-sd1"]
    parts = {name: manager.load(record, name) for name in ("vae", "text_encoder", "tokenizer", "unet")}
    parts["scheduler"] = make_sd_scheduler("euler", dict(manager.load(record, "scheduler").config))
    if xl:
        parts.update(
            text_encoder_2=manager.load(record, "text_encoder_2"), tokenizer_2=manager.load(record, "tokenizer_2")
        )
        pipe = StableDiffusionXLImg2ImgPipeline(
            **parts, requires_aesthetics_score=False, force_zeros_for_empty_prompt=True
        )
    else:
        pipe = StableDiffusionImg2ImgPipeline(
            **parts, safety_checker=None, feature_extractor=None, requires_safety_checker=False
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("xl", [False, True], ids=["sd1", "sdxl"])
def test_image_to_image_makes_the_img2img_pipelines_image_from_the_same_latents_and_noise(
    manager: StandInManager, tmp_path: Path, xl: bool
) -> None:
    """i2l's latents equal the own encode node's at seed 0; from them, denoise_latents with denoising_start
    1 - strength and the noise node's noise makes what the img2img pipeline makes when given those latents (it then
    draws its noise first from the seed's generator, as the noise node draws it)."""
    name, base, build = ("demo-sdxl", "sdxl", sdxl_graph) if xl else ("demo-sd1", "sd-1", sd1_graph)
    run = Run(manager, tmp_path)
    source = _source_image(run)
    graph = filled(build(model_of(manager, name, base), image=source, strength=0.5, steps=8))
    outputs = run(graph)
    # The own encode node with seed 0 gives i2l's latents.
    encode = "sdxl_vae_encode" if xl else "sd_vae_encode"
    own_graph = {
        "id": "encode",
        "nodes": {
            "encode": {
                "id": "encode",
                "type": encode,
                "model": {"name": name},
                "image": {"image_name": source},
                "seed": 0,
            }
        },
        "edges": [],
    }
    own = Run(manager, tmp_path / "own")
    own.images, own.tensors = run.images, run.tensors
    own_latents = run.tensors.load(own(own_graph)["encode"].latents.latents_name)
    i2l_latents = run.tensors.load(outputs["i2l:abc"].latents.latents_name)
    assert torch.equal(next(iter(own_latents.values())), next(iter(i2l_latents.values())))
    pipe = _img2img_pipeline(manager, xl)
    kwargs = {"original_size": (SIZE, SIZE), "target_size": (SIZE, SIZE)} if xl else {}
    expected = pipe(
        PROMPT,
        image=next(iter(i2l_latents.values())),
        negative_prompt=NEGATIVE,
        strength=0.5,
        num_inference_steps=8,
        guidance_scale=5.0 if xl else 7.5,
        generator=torch.Generator("cpu").manual_seed(SEED),
        **kwargs,
    ).images[0]
    assert max_difference(run.image(outputs[OUTPUT]), expected) <= 1
    assert [step for node, step, _, _ in run.progress if node == "denoise_latents:abc"] == [1, 2, 3, 4]


# --- stochastic samplers ---------------------------------------------------------------------------------------


def _reference_latents(manager: StandInManager, scheduler_name: str, step_seed: int) -> torch.Tensor:
    """Euler ancestral on the demo SD-1 UNet, written out: the noise node's noise times init_noise_sigma, CFG 7.5,
    and the scheduler's step noise from a CPU generator seeded `step_seed`."""
    from invokeai.backend.families.sd1 import generation
    from invokeai.backend.families.sd_schedulers import make_sd_scheduler

    record = manager.records["demo-sd1"]
    unet, tokenizer = manager.load(record, "unet"), manager.load(record, "tokenizer")
    encoder = manager.load(record, "text_encoder")
    embeds = torch.cat([generation.encode_prompt(encoder, tokenizer, p, "cpu") for p in (NEGATIVE, PROMPT)])
    scheduler = make_sd_scheduler(scheduler_name, dict(manager.load(record, "scheduler").config))
    scheduler.set_timesteps(STEPS)
    noise = torch.randn(1, 4, SIZE // 8, SIZE // 8, generator=torch.Generator().manual_seed(SEED))
    latents = noise * scheduler.init_noise_sigma
    generator = torch.Generator().manual_seed(step_seed)
    with torch.inference_mode():
        for t in scheduler.timesteps:
            model_input = scheduler.scale_model_input(torch.cat([latents] * 2), t)
            uncond, cond = unet(model_input, t, encoder_hidden_states=embeds).sample.chunk(2)
            latents = scheduler.step(uncond + 7.5 * (cond - uncond), t, latents, generator=generator).prev_sample
    return latents


def test_a_stochastic_sampler_is_seeded_with_the_seeds_bits_flipped(manager: StandInManager, tmp_path: Path) -> None:
    model = model_of(manager, "demo-sd1", "sd-1")
    run = Run(manager, tmp_path)
    outputs = run(filled(sd1_graph(model, scheduler="euler_a")))
    made = run.tensors.load(outputs["denoise_latents:abc"].latents.latents_name)["sd1_latents"]
    expected = _reference_latents(manager, "euler_a", SEED ^ 0xFFFFFFFF)
    assert torch.allclose(made, expected, atol=1e-5)
    assert not torch.allclose(made, _reference_latents(manager, "euler_a", SEED), atol=1e-3)


# --- collect ---------------------------------------------------------------------------------------------------


def test_prompts_collected_into_one_conditioning_are_joined_token_sequence_by_sequence(
    manager: StandInManager, tmp_path: Path
) -> None:
    """Two prompts into one collect: denoise_latents conditions on both token sequences side by side, as InvokeAI
    joins prompts without masks; a negative of another length is padded and masked out."""
    from invokeai.backend.families.sd1 import generation
    from invokeai.backend.families.sd_denoise import invokeai_start
    from invokeai.backend.families.sd_schedulers import make_sd_scheduler

    model = model_of(manager, "demo-sd1", "sd-1")
    graph = filled(sd1_graph(model, steps=3))
    graph["nodes"]["second:abc"] = {"id": "second:abc", "type": "compel", "prompt": "a red house"}
    graph["edges"] += [
        _edge("clip_skip:abc", "clip", "second:abc", "clip"),
        _edge("second:abc", "conditioning", "pos_cond_collect:abc", "item"),
    ]
    run = Run(manager, tmp_path)
    outputs = run(graph)
    collected = outputs["pos_cond_collect:abc"].collection
    assert len(collected) == 2
    made = run.tensors.load(outputs["denoise_latents:abc"].latents.latents_name)["sd1_latents"]

    record = manager.records["demo-sd1"]
    encoder, tokenizer = manager.load(record, "text_encoder"), manager.load(record, "tokenizer")
    # In the order of their source nodes' ids: "pos_cond:abc" before "second:abc".
    prompts = [PROMPT, "a red house"]
    positive = torch.cat([generation.encode_prompt(encoder, tokenizer, p, "cpu") for p in prompts], dim=1)
    negative = generation.encode_prompt(encoder, tokenizer, NEGATIVE, "cpu")
    scheduler = make_sd_scheduler("euler", dict(manager.load(record, "scheduler").config))
    noise = torch.randn(1, 4, SIZE // 8, SIZE // 8, generator=torch.Generator().manual_seed(SEED))
    start = invokeai_start(
        scheduler,
        steps=3,
        denoising_start=0,
        denoising_end=1,
        noise=noise,
        latents=None,
        seed=SEED,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    expected = generation.denoise_from(
        manager.load(record, "unet"),
        scheduler,
        start,
        positive=positive,
        negative=negative,
        cfg_scale=7.5,
        device="cpu",
        dtype=torch.float32,
    )
    assert torch.allclose(made, expected, atol=1e-5)


# --- refusals --------------------------------------------------------------------------------------------------


def _parse_error(graph: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        Graph.model_validate(graph)
    return str(caught.value)


@pytest.mark.parametrize(
    ("node", "field", "value", "message"),
    [
        ("denoise_latents:abc", "scheduler", "no_such", "Input should be 'euler'"),
        ("denoise_latents:abc", "scheduler", "er_sde", "InvokeAI's scheduler 'er_sde' is not run by this server yet"),
        ("denoise_latents:abc", "hidiffusion", True, "HiDiffusion is not supported by this server yet"),
        ("denoise_latents:abc", "cfg_scale", 0.5, "cfg_scale must be greater than 1"),
        ("denoise_latents:abc", "cfg_rescale_multiplier", 1.0, "less than 1"),
        ("compel", "mask", {"tensor_name": "m"}, "regional prompt masks are not supported"),
        (OUTPUT, "tiled", True, "tiled VAE decoding and encoding is not supported"),
        ("noise:abc", "noise_type", "FLUX", "noise_type 'FLUX' is not made by this server's noise node yet"),
        ("noise:abc", "width", 60, "multiple of 8"),
    ],
)
def test_what_this_server_does_not_run_is_refused_naming_the_field(
    node: str, field: str, value: Any, message: str
) -> None:
    graph = sd1_graph({"name": "demo-sd1"})
    node = "pos_cond:abc" if node == "compel" else node
    graph["nodes"][node][field] = value
    error = _parse_error(graph)
    assert message in error and field in error


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("control", {"control_model": {}}, "ControlNets"),
        ("ip_adapter", [{"image": {}}], "IP-Adapters"),
        ("t2i_adapter", {"image": {}}, "T2I-Adapters"),
        ("denoise_mask", {"mask_name": "m"}, "inpaint masks (denoise_mask)"),
    ],
)
def test_adapters_and_masks_are_accepted_only_empty(field: str, value: Any, what: str) -> None:
    graph = sd1_graph({"name": "demo-sd1"})
    for empty in (None, []):
        graph["nodes"]["denoise_latents:abc"][field] = empty
        Graph.model_validate(graph)
    graph["nodes"]["denoise_latents:abc"][field] = value
    assert f"{what} are not supported by this server yet; send null" in _parse_error(graph)


def test_a_lora_on_the_unet_is_refused_when_the_denoise_runs(manager: StandInManager, tmp_path: Path) -> None:
    # The handle is an output here: the refusal comes when denoise_latents is given it, naming what is missing.
    model = model_of(manager, "demo-sd1", "sd-1")
    graph = filled(sd1_graph(model, steps=1))
    graph["nodes"]["denoise_latents:abc"]["unet"] = {
        "unet": model,
        "scheduler": model,
        "loras": [{"lora": model, "weight": 1.0}],
    }
    graph["edges"] = [e for e in graph["edges"] if e["destination"]["field"] != "unet"]
    assert "LoRAs are not supported by this server yet" in _parse_error(graph)


@pytest.mark.parametrize(
    ("node", "model", "message"),
    [
        ("sd1_model_loader:abc", "demo-sdxl", "main_model_loader needs a model of the sd-1 family"),
        ("sd1_model_loader:abc", "demo-krea2", "main_model_loader needs a model of the sd-1 family"),
    ],
)
def test_a_model_of_another_family_is_refused_by_the_loader(
    manager: StandInManager, tmp_path: Path, node: str, model: str, message: str
) -> None:
    graph = filled(sd1_graph(model_of(manager, "demo-sd1", "sd-1"), steps=1))
    graph["nodes"][node]["model"] = {"name": model}
    with pytest.raises(ValueError, match=message):
        Run(manager, tmp_path)(graph)


def test_sdxl_conditioning_in_an_sd1_denoise_is_refused(manager: StandInManager, tmp_path: Path) -> None:
    graph = copy.deepcopy(filled(sd1_graph(model_of(manager, "demo-sd1", "sd-1"), steps=1)))
    graph["nodes"]["xl:abc"] = {"id": "xl:abc", "type": "sdxl_model_loader", "model": {"name": "demo-sdxl"}}
    graph["nodes"]["xl_cond:abc"] = {"id": "xl_cond:abc", "type": "sdxl_compel_prompt", "prompt": "x"}
    graph["edges"] = [e for e in graph["edges"] if e["source"]["node_id"] != "pos_cond:abc"]
    graph["edges"] += [
        _edge("xl:abc", "clip", "xl_cond:abc", "clip"),
        _edge("xl:abc", "clip2", "xl_cond:abc", "clip2"),
        _edge("xl_cond:abc", "conditioning", "pos_cond_collect:abc", "item"),
    ]
    with pytest.raises(ValueError, match="was not made by compel or sd_text_encoder, which denoise_latents needs"):
        Run(manager, tmp_path)(graph)


def test_a_cfg_scale_list_needs_one_value_per_step(manager: StandInManager, tmp_path: Path) -> None:
    graph = filled(sd1_graph(model_of(manager, "demo-sd1", "sd-1"), steps=2))
    graph["nodes"]["denoise_latents:abc"]["cfg_scale"] = [7.5, 7.5, 7.5]
    with pytest.raises(ValueError, match=r"cfg_scale has 3 values; a list gives one per step \(2\)"):
        Run(manager, tmp_path)(graph)
    graph["nodes"]["denoise_latents:abc"]["cfg_scale"] = [7.5, 7.5]
    Run(manager, tmp_path / "again")(graph)


def test_rand_int_is_not_cached_and_differs_between_runs() -> None:
    from invokeai.app.nodes.primitives import RandomIntInvocation

    node = RandomIntInvocation(id="r")
    assert node.use_cache is False
    assert len({RandomIntInvocation(id="r").invoke(None).value for _ in range(20)}) > 1  # type: ignore[arg-type]
