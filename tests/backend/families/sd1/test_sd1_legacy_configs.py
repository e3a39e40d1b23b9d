"""An SD-1 folder with configs from diffusers' first releases samples as the stock pipeline samples it: the server
loads each component (`load_component`, as the model manager does), builds the sampler on the loaded scheduler's
config and generates; StableDiffusion(Img2Img)Pipeline.from_pretrained on the same folder, switched to the same
sampler with `Cls.from_config(pipe.scheduler.config, **options)`, makes the image it is compared with (1/255).

The pipeline's __init__ rewrites such configs (steps_offset 1, clip_sample false, UNet sample_size 64); a
scheduler's own options (DDIM's set_alpha_to_one) pass through unchanged."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from invokeai.backend.families.sd1 import generation as sd1
from invokeai.backend.families.sd1.descriptor import FAMILY
from invokeai.backend.families.sd_schedulers import scheduler_choice

os.environ["HF_HUB_OFFLINE"] = "1"

PROMPT = "a photo of a cat"
SEED = 42
STEPS = 4
CFG = 7.5
SIZE = 64
STRENGTH = 0.75

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from invokeai.backend.models.demo import build_demo_models

    (model,) = build_demo_models(tmp_path_factory.mktemp("sd1-legacy"), names=("demo-sd1",))
    return Path(model.path)


def _copy(demo: Path, destination: Path, component: str, file: str, **values: Any) -> Path:
    """A copy of the demo folder whose component config holds `values`."""
    shutil.copytree(demo, destination)
    path = destination / component / file
    config = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**config, **values}), encoding="utf-8")
    return destination


@pytest.fixture(scope="module")
def copies(demo_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """By name, a copy of demo-sd1 with one legacy or non-default config, made once."""
    scheduler = ("scheduler", "scheduler_config.json")
    variants: dict[str, tuple[str, str, dict[str, Any]]] = {
        # What SD-1 folders of diffusers 0.2-0.5 shipped: a shifted schedule and clipped x0.
        "clip_sample": (*scheduler, {"clip_sample": True}),
        "steps_offset": (*scheduler, {"steps_offset": 0}),
        "set_alpha_to_one": (*scheduler, {"set_alpha_to_one": True}),
        # A UNet config written before diffusers 0.9 (the demo's sample_size, 8, is below 64).
        "old_unet": ("unet", "config.json", {"_diffusers_version": "0.8.0"}),
    }
    made: dict[str, Path] = {}

    def copy(name: str) -> Path:
        if name not in made:
            component, file, values = variants[name]
            made[name] = _copy(demo_folder, tmp_path_factory.mktemp(name) / "model", component, file, **values)
        return made[name]

    return copy


def _server_parts(folder: Path) -> dict[str, Any]:
    from invokeai.backend.models.loaders import components_of, load_component
    from invokeai.backend.models.probe import probe_model

    probe = probe_model(folder)
    return {name: load_component(probe, name) for name in components_of(probe)}


def _server_image(folder: Path, scheduler: str, init_image: Image.Image | None = None) -> Image.Image:
    """What the sd-1 nodes make: components from the loader, the sampler from the loaded scheduler's config."""
    parts = _server_parts(folder)
    encode = sd1.encode_prompt
    init_latents = None if init_image is None else sd1.vae_encode(parts["vae"], init_image, SEED)
    latents = sd1.denoise(
        parts["unet"],
        FAMILY.make_scheduler(scheduler, dict(parts["scheduler"].config)),
        positive=encode(parts["text_encoder"], parts["tokenizer"], PROMPT, "cpu"),
        negative=encode(parts["text_encoder"], parts["tokenizer"], "", "cpu"),
        width=SIZE,
        height=SIZE,
        steps=STEPS,
        cfg_scale=CFG,
        seed=SEED,
        device="cpu",
        dtype=torch.float32,
        init_latents=init_latents,
        strength=STRENGTH,
    )
    return sd1.vae_decode(parts["vae"], latents)


def _stock_pipeline(folder: Path, scheduler: str | None, img2img: bool = False) -> Any:
    """from_pretrained on the folder (its __init__ rewrites what it rewrites), switched to the sampler."""
    import diffusers

    cls = diffusers.StableDiffusionImg2ImgPipeline if img2img else diffusers.StableDiffusionPipeline
    pipe = cls.from_pretrained(folder, torch_dtype=torch.float32, local_files_only=True, safety_checker=None)
    if scheduler is not None:
        choice = scheduler_choice(scheduler)
        pipe.scheduler = getattr(diffusers, choice.class_name).from_config(pipe.scheduler.config, **choice.options)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _stock_image(folder: Path, scheduler: str, init_image: Image.Image | None = None) -> Image.Image:
    pipe = _stock_pipeline(folder, scheduler, img2img=init_image is not None)
    size = {"image": init_image, "strength": STRENGTH} if init_image is not None else {"height": SIZE, "width": SIZE}
    image: Image.Image = pipe(
        PROMPT, num_inference_steps=STEPS, guidance_scale=CFG, generator=torch.Generator().manual_seed(SEED), **size
    ).images[0]
    return image


def _max_difference(a: Image.Image, b: Image.Image) -> int:
    assert a.size == b.size
    return int(np.abs(np.asarray(a, np.int16) - np.asarray(b.convert("RGB"), np.int16)).max())


def _source_image() -> Image.Image:
    pixels = np.random.default_rng(SEED).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize(
    ("legacy", "scheduler"),
    [
        # The samplers that clip x0 when the config says so.
        ("clip_sample", "ddim"),
        ("clip_sample", "ddpm"),
        ("clip_sample", "lcm"),
        ("clip_sample", "heun"),
        # Every sampler on "leading" spacing adds steps_offset to its timesteps (LCM and TCD do not read it).
        ("steps_offset", "ddim"),
        ("steps_offset", "ddpm"),
        ("steps_offset", "euler"),
        ("steps_offset", "pndm"),
        # The final step's alpha: DDIM's own option, which the pipeline leaves as the folder gives it.
        ("set_alpha_to_one", "ddim"),
    ],
)
def test_a_legacy_scheduler_config_samples_as_the_stock_pipeline(
    copies: Callable[[str], Path], legacy: str, scheduler: str
) -> None:
    folder = copies(legacy)
    assert _max_difference(_server_image(folder, scheduler), _stock_image(folder, scheduler)) <= 1


@pytest.mark.parametrize("legacy", ["clip_sample", "steps_offset"])
def test_image_to_image_on_a_legacy_scheduler_config_is_the_img2img_pipelines(
    copies: Callable[[str], Path], legacy: str
) -> None:
    folder, source = copies(legacy), _source_image()
    assert _max_difference(_server_image(folder, "ddim", source), _stock_image(folder, "ddim", source)) <= 1


def test_the_loaded_configs_are_the_ones_the_pipeline_runs(copies: Callable[[str], Path]) -> None:
    """The scheduler and UNet configs the loader hands out (and `architecture` reports) are those the pipeline's
    __init__ leaves; the bookkeeping (`_use_default_values`, the writing version) is kept, as the pipeline keeps it."""
    from invokeai.backend.models.loaders import architecture
    from invokeai.backend.models.probe import probe_model

    def without_path(config: Any) -> dict[str, Any]:
        # Where the file was read from: the pipeline names the folder, a component loaded alone its subfolder.
        return {key: value for key, value in config.items() if key != "_name_or_path"}

    for legacy, component in (("clip_sample", "scheduler"), ("steps_offset", "scheduler"), ("old_unet", "unet")):
        folder = copies(legacy)
        stock = getattr(_stock_pipeline(folder, None), component).config
        assert without_path(_server_parts(folder)[component].config) == without_path(stock)
    probe = probe_model(copies("old_unet"))
    assert architecture(probe, "unet")["sample_size"] == 64
