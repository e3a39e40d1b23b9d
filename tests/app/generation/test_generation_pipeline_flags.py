"""The flags a stock pipeline reads from model_index.json reach the server's nodes: each case is a copy of a demo
folder whose model_index.json holds a non-default value, installed as a record, run through the family's nodes with
the real model manager (in-process, on the CPU in float32), and compared with the image (within 1/255) that the
stock pipeline, `from_pretrained` on the same folder, makes for the same prompt, seed, steps and sampler.

SDXL: force_zeros_for_empty_prompt (both pipelines: zeros or the empty prompt's conditioning for a missing negative
prompt under guidance) and requires_aesthetics_score (the img2img pipeline: aesthetic-score time ids). Krea-2's
is_distilled and text_encoder_select_layers go through the same reader."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from invokeai.app.nodes.base import BaseInvocation, ImageField, InvocationContext
from invokeai.app.services.images import ImageService
from invokeai.app.services.model_manager import ModelManager
from invokeai.app.services.model_records import ModelRecord, ModelRecordService
from invokeai.app.services.sqlite import SqliteDatabase
from invokeai.app.services.tensors import TensorStore
from invokeai.backend.cache.model_cache import ModelCache
from invokeai.backend.families.sd_schedulers import scheduler_choice

os.environ["HF_HUB_OFFLINE"] = "1"

CPU = torch.device("cpu")
PROMPT = "a photo of a cat"
SEED = 3
STEPS = 3
CFG = 7.0
SIZE = 64
STRENGTH = 0.75

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def demo_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from invokeai.backend.models.demo import build_demo_models

    built = build_demo_models(tmp_path_factory.mktemp("flags-demo"), names=("demo-sdxl", "demo-krea2"))
    return {model.name: Path(model.path) for model in built}


def _with_index(source: Path, destination: Path, **flags: Any) -> Path:
    """A copy of a demo folder whose model_index.json also holds `flags`."""
    shutil.copytree(source, destination)
    index = destination / "model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text(encoding="utf-8")), **flags}), encoding="utf-8")
    return destination


def _aesthetic_unet(folder: Path) -> None:
    """Replace the copy's UNet with one whose add embedding takes five time ids (size, crop, aesthetic score), as
    a UNet trained for requires_aesthetics_score does; seeded, so every build is the same."""
    from diffusers import UNet2DConditionModel

    config = dict(UNet2DConditionModel.load_config(folder / "unet"))
    time_dim = config["addition_time_embed_dim"]
    config["projection_class_embeddings_input_dim"] += -time_dim  # six time ids -> five
    torch.manual_seed(SEED)
    shutil.rmtree(folder / "unet")
    UNet2DConditionModel.from_config(config).save_pretrained(folder / "unet", safe_serialization=True)


@pytest.fixture(scope="module")
def folders(demo_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("flags")
    sdxl, krea2 = demo_folders["demo-sdxl"], demo_folders["demo-krea2"]
    made = {
        "zeros": sdxl,  # the demo's own flag: force_zeros_for_empty_prompt true
        "no-zeros": _with_index(sdxl, root / "no-zeros", force_zeros_for_empty_prompt=False),
        "aesthetic": _with_index(sdxl, root / "aesthetic", requires_aesthetics_score=True),
        "aesthetic-base-unet": _with_index(sdxl, root / "aesthetic-base-unet", requires_aesthetics_score=True),
        "krea2-distilled": _with_index(
            krea2, root / "krea2-distilled", is_distilled=True, text_encoder_select_layers=[3, 1, 2]
        ),
    }
    _aesthetic_unet(made["aesthetic"])
    return made


@pytest.fixture(scope="module")
def manager(folders: dict[str, Path]) -> ModelManager:
    """The real model manager over one record per folder, named as `folders` names them."""
    from invokeai.backend.models.probe import probe_model

    records = ModelRecordService(SqliteDatabase(None))
    for name, folder in folders.items():
        probe = probe_model(folder)
        records.add(
            ModelRecord(
                key=f"key-{name}",
                name=name,
                family=probe.family,
                type=probe.type,
                format=probe.format,
                path=str(probe.path),
                size=probe.size,
                hash=None,
                source=str(folder),
                config_variant=probe.config_variant,
            )
        )
    return ModelManager(records, ModelCache(1 << 32, CPU, 0), CPU, torch.float32)


class Nodes:
    """Runs nodes as the processor does, with contexts over the manager, one tensor store and one image service."""

    def __init__(self, manager: ModelManager, outputs: Path) -> None:
        self.manager = manager
        self.images = ImageService(SqliteDatabase(None), outputs, 1 << 20)
        self.tensors = TensorStore()

    def context(self, node_type: str) -> InvocationContext:
        return InvocationContext(
            queue_id="default",
            item_id=1,
            session_id="session",
            node_id=node_type,
            node_type=node_type,
            graph={},
            images=self.images,
            on_progress=lambda *_: None,
            is_canceled=lambda: False,
            models=self.manager,
            tensors=self.tensors,
        )

    def __call__(self, node: BaseInvocation) -> Any:
        return node.invoke(self.context(node.type))

    def store(self, image: Image.Image) -> ImageField:
        return self.context("source").save_image(image)

    def image(self, output: Any) -> Image.Image:
        return self.images.get_pil(output.image.image_name)


@pytest.fixture
def invoke(manager: ModelManager, tmp_path: Path) -> Nodes:
    return Nodes(manager, tmp_path / "outputs")


def _max_difference(a: Image.Image, b: Image.Image) -> int:
    assert a.size == b.size
    return int(np.abs(np.asarray(a.convert("RGB"), np.int16) - np.asarray(b.convert("RGB"), np.int16)).max())


def _source_image() -> Image.Image:
    return Image.fromarray(np.random.default_rng(SEED).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))


# --- SDXL ------------------------------------------------------------------------------------------------------


def _sdxl_served(invoke: Nodes, name: str, scheduler: str, source: Image.Image | None = None) -> Image.Image:
    """sdxl_text_encoder -> sdxl_denoise (cfg 7, no negative conditioning) -> sdxl_vae_decode; with `source`,
    sdxl_vae_encode first (image-to-image)."""
    from invokeai.app.nodes import sdxl

    model = {"name": name}
    positive = invoke(sdxl.SDXLTextEncoderInvocation(id="node", model=model, prompt=PROMPT)).conditioning
    latents = None
    if source is not None:
        latents = invoke(
            sdxl.SDXLVaeEncodeInvocation(id="node", model=model, image=invoke.store(source), seed=SEED)
        ).latents
    denoised = invoke(
        sdxl.SDXLDenoiseInvocation(
            id="node",
            model=model,
            positive_conditioning=positive,
            latents=latents,
            denoising_strength=STRENGTH,
            width=SIZE,
            height=SIZE,
            steps=STEPS,
            cfg_scale=CFG,
            scheduler=scheduler,
            seed=SEED,
        )
    ).latents
    return invoke.image(invoke(sdxl.SDXLVaeDecodeInvocation(id="node", model=model, latents=denoised)))


def _sdxl_stock(folder: Path, scheduler: str, source: Image.Image | None = None) -> Image.Image:
    import diffusers

    cls = diffusers.StableDiffusionXLImg2ImgPipeline if source is not None else diffusers.StableDiffusionXLPipeline
    pipe = cls.from_pretrained(folder, torch_dtype=torch.float32, local_files_only=True, add_watermarker=False)
    choice = scheduler_choice(scheduler)
    pipe.scheduler = getattr(diffusers, choice.class_name).from_config(pipe.scheduler.config, **choice.options)
    pipe.set_progress_bar_config(disable=True)
    size = {"image": source, "strength": STRENGTH} if source is not None else {"width": SIZE, "height": SIZE}
    image: Image.Image = pipe(
        PROMPT,
        num_inference_steps=STEPS,
        guidance_scale=CFG,
        generator=torch.Generator("cpu").manual_seed(SEED),
        **size,
    ).images[0]
    return image


@pytest.mark.parametrize("name", ["zeros", "no-zeros"])
@pytest.mark.parametrize("img2img", [False, True], ids=["text-to-image", "image-to-image"])
def test_force_zeros_for_empty_prompt_decides_the_missing_negative(
    invoke: Nodes, folders: dict[str, Path], name: str, img2img: bool
) -> None:
    source = _source_image() if img2img else None
    served = _sdxl_served(invoke, name, "euler", source)
    assert _max_difference(served, _sdxl_stock(folders[name], "euler", source)) <= 1


def test_requires_aesthetics_score_conditions_image_to_image_on_the_scores(
    invoke: Nodes, folders: dict[str, Path]
) -> None:
    source = _source_image()
    for scheduler in ("euler", "ddim"):
        served = _sdxl_served(invoke, "aesthetic", scheduler, source)
        assert _max_difference(served, _sdxl_stock(folders["aesthetic"], scheduler, source)) <= 1


@pytest.mark.parametrize(
    ("name", "img2img"),
    [("aesthetic", False), ("aesthetic-base-unet", True)],
    ids=["aesthetic unet, text-to-image", "base unet, image-to-image"],
)
def test_a_unet_that_does_not_fit_requires_aesthetics_score_is_refused_as_the_pipeline_refuses_it(
    invoke: Nodes, folders: dict[str, Path], name: str, img2img: bool
) -> None:
    source = _source_image() if img2img else None
    with pytest.raises(ValueError, match="embedding vector"):
        _sdxl_stock(folders[name], "euler", source)
    with pytest.raises(ValueError, match="requires_aesthetics_score"):
        _sdxl_served(invoke, name, "euler", source)


# --- Krea-2 ----------------------------------------------------------------------------------------------------


def test_krea2_pipeline_options_reach_its_nodes(invoke: Nodes, folders: dict[str, Path]) -> None:
    """is_distilled (a fixed shift) and text_encoder_select_layers (the tapped layers), read by the generic reader
    the SDXL flags use, make Krea2Pipeline's image."""
    from diffusers import Krea2Pipeline

    from invokeai.app.nodes import krea2, qwen_image

    loaded = invoke(krea2.Krea2ModelLoaderInvocation(id="node", model={"name": "krea2-distilled"}))
    encoder = loaded.qwen3_vl_encoder
    positive = invoke(krea2.Krea2TextEncoderInvocation(id="node", qwen3_vl_encoder=encoder, prompt=PROMPT)).conditioning
    negative = invoke(krea2.Krea2TextEncoderInvocation(id="node", qwen3_vl_encoder=encoder, prompt="")).conditioning
    denoised = invoke(
        krea2.Krea2DenoiseInvocation(
            id="node",
            transformer=loaded.transformer,
            positive_conditioning=positive,
            negative_conditioning=negative,
            width=SIZE,
            height=SIZE,
            steps=STEPS,
            cfg_scale=5.5,  # InvokeAI's convention: the pipeline's 4.5 + 1
            seed=SEED,
        )
    ).latents
    decoded = invoke(qwen_image.QwenImageLatentsToImageInvocation(id="node", vae=loaded.vae, latents=denoised))
    served = invoke.image(decoded)
    pipe = Krea2Pipeline.from_pretrained(folders["krea2-distilled"], torch_dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.config.is_distilled and pipe.text_encoder_select_layers == (3, 1, 2)
    stock = pipe(
        PROMPT,
        width=SIZE,
        height=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=4.5,
        generator=torch.Generator("cpu").manual_seed(SEED),
    ).images[0]
    assert _max_difference(served, stock) <= 1
