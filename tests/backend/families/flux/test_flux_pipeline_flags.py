"""The scheduler config flags FluxPipeline and FluxImg2ImgPipeline read at call time, honoured as each reads them:
a copy of demo-flux whose scheduler_config.json sets use_flow_sigmas, loaded by the server's loader and run through
the flux generation code (the sampler as the flux nodes build it), equals `from_pretrained` on the copy, within 1/255.
The text-to-image pipeline then lets the scheduler make its sigmas; the image-to-image pipeline does not read the flag.
(Neither pipeline's __init__ rewrites a component config, and neither registers a model_index.json flag.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from invokeai.backend.families.flux import generation
from invokeai.backend.families.flux.constants import default_t5_tokens
from invokeai.backend.families.flux.descriptor import FAMILY

PROMPT = "a green tree"
STEPS = 3
SEED = 4
WIDTH, HEIGHT = 96, 64
STRENGTH = 0.6
GUIDANCE = 3.5  # given to both: the img2img pipeline's default (7) is not the text-to-image one's


@pytest.fixture(scope="module")
def flow_sigmas_folder(demo_flux: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("flux-flow-sigmas") / "model"
    shutil.copytree(demo_flux, folder)
    path = folder / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "use_flow_sigmas": True}), encoding="utf-8")
    return folder


def _served(folder: Path, source: Image.Image | None) -> Image.Image:
    from invokeai.backend.models.loaders import components_of, load_component
    from invokeai.backend.models.probe import probe_model

    probe = probe_model(folder)
    parts = {name: load_component(probe, name) for name in components_of(probe)}
    init = None if source is None else generation.vae_encode(parts["vae"], source, SEED)
    latents = generation.denoise(
        parts["transformer"],
        FAMILY.make_scheduler("euler", dict(parts["scheduler"].config)),
        prompt_embeds=generation.encode_t5(
            parts["text_encoder_2"], parts["tokenizer_2"], PROMPT, "cpu", default_t5_tokens(parts["transformer"].config)
        ),
        pooled_embeds=generation.encode_clip(parts["text_encoder"], parts["tokenizer"], PROMPT, "cpu"),
        width=WIDTH,
        height=HEIGHT,
        steps=STEPS,
        seed=SEED,
        device="cpu",
        dtype=torch.float32,
        guidance=GUIDANCE,
        init_latents=init,
        strength=STRENGTH,
    )
    return generation.vae_decode(parts["vae"], latents)


def _stock(folder: Path, source: Image.Image | None) -> Image.Image:
    from diffusers import FluxImg2ImgPipeline, FluxPipeline

    cls: Any = FluxPipeline if source is None else FluxImg2ImgPipeline
    pipe = cls.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    extra = {} if source is None else {"image": source, "strength": STRENGTH}
    image: Image.Image = pipe(
        PROMPT,
        width=WIDTH,
        height=HEIGHT,
        num_inference_steps=STEPS,
        guidance_scale=GUIDANCE,
        generator=torch.Generator("cpu").manual_seed(SEED),
        **extra,
    ).images[0]
    return image


@pytest.mark.parametrize("img2img", [False, True], ids=["text-to-image", "image-to-image"])
def test_use_flow_sigmas_is_read_where_the_pipeline_reads_it(flow_sigmas_folder: Path, img2img: bool) -> None:
    source = None
    if img2img:
        source = Image.fromarray((np.random.RandomState(SEED).rand(HEIGHT, WIDTH, 3) * 255).astype(np.uint8))
    served, stock = _served(flow_sigmas_folder, source), _stock(flow_sigmas_folder, source)
    assert int(np.abs(np.asarray(served, np.int16) - np.asarray(stock, np.int16)).max()) <= 1
