"""Qwen-Image-Edit generation equals the stock pipelines' images on demo-qwen-image-edit (CPU fp32, within 1/255 per
pixel): QwenImageEditPipeline with one reference image and QwenImageEditPlusPipeline with two, reference images of
other sizes than the output (the pipelines resize them), several sizes, seeds and true CFG scales, with and without a
negative prompt."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from invokeai.backend.families.qwen_image import edit, generation
from invokeai.backend.families.qwen_image.constants import EDIT_PIPELINE, EDIT_PLUS_PIPELINE

STEPS = 2


def edit_pipeline(folder: Path, class_name: str) -> Any:
    """The stock Edit pipeline `class_name` on `folder`. Its processor is passed in, read from the folder's
    processor/ files: transformers' Qwen2VLProcessor cannot be built without torchvision, which this venv lacks."""
    import diffusers

    from invokeai.backend.families.qwen_image.vision_processor import load_processor

    pipe = getattr(diffusers, class_name).from_pretrained(
        folder, processor=load_processor(folder), dtype=torch.float32, local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def gradient(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, width, dtype=np.float32)[None, :, None] * np.ones((height, 1, 3), np.float32)
    noise = rng.uniform(-40, 40, (height, width, 3)).astype(np.float32)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def pipes(demo_qwen_image_edit: Path) -> dict[str, Any]:
    edit_pipe = edit_pipeline(demo_qwen_image_edit, EDIT_PIPELINE)
    # Edit-Plus on the same components: only the prompting and the reference sizes differ.
    plus = getattr(__import__("diffusers"), EDIT_PLUS_PIPELINE)(**edit_pipe.components)
    plus.set_progress_bar_config(disable=True)
    # Qwen-Image-Edit-2511: Edit-Plus with a transformer that modulates the reference tokens at timestep zero.
    from invokeai.backend.families.qwen_image import demo

    zero_cond = getattr(__import__("diffusers"), EDIT_PLUS_PIPELINE)(
        **{**edit_pipe.components, "transformer": demo.build_transformer(zero_cond_t=True)}
    )
    zero_cond.set_progress_bar_config(disable=True)
    return {EDIT_PIPELINE: edit_pipe, EDIT_PLUS_PIPELINE: plus, "2511": zero_cond}


def ours(
    pipe: Any, pipeline: str, prompt: str, images: list[Image.Image], width: int, height: int, seed: int, cfg: float,
    negative: str | None,
) -> Image.Image:  # fmt: skip
    embeds, mask = edit.encode_prompt(pipe.text_encoder, pipe.processor, pipeline, prompt, images, "cpu")
    negative_embeds = negative_mask = None
    if negative is not None:
        negative_embeds, negative_mask = edit.encode_prompt(
            pipe.text_encoder, pipe.processor, pipeline, negative, images, "cpu"
        )
    references = [edit.encode_reference(pipe.vae, image, dtype=torch.float32) for image in images]
    latents = generation.denoise(
        pipe.transformer,
        pipe.scheduler,
        prompt_embeds=embeds,
        prompt_mask=mask,
        negative_embeds=negative_embeds,
        negative_mask=negative_mask,
        width=width,
        height=height,
        steps=STEPS,
        seed=seed,
        device="cpu",
        dtype=torch.float32,
        true_cfg_scale=cfg,
        reference_latents=references,
    )
    return generation.vae_decode(pipe.vae, latents)


def theirs(
    pipe: Any, pipeline: str, prompt: str, images: list[Image.Image], width: int, height: int, seed: int, cfg: float,
    negative: str | None,
) -> Image.Image:  # fmt: skip
    return pipe(
        image=images if pipeline == EDIT_PLUS_PIPELINE else images[0],
        prompt=prompt,
        negative_prompt=negative,
        true_cfg_scale=cfg,
        width=width,
        height=height,
        num_inference_steps=STEPS,
        generator=torch.Generator("cpu").manual_seed(seed),
        output_type="pil",
    ).images[0]


def difference(a: Image.Image, b: Image.Image) -> int:
    return int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())


@pytest.mark.parametrize(
    ("pipeline", "references", "width", "height", "seed", "cfg", "negative"),
    [
        (EDIT_PIPELINE, [(96, 64)], 64, 64, 0, 4.0, " "),
        (EDIT_PIPELINE, [(80, 112)], 96, 64, 7, 2.5, "blurry, red"),
        (EDIT_PLUS_PIPELINE, [(96, 64), (48, 80)], 64, 48, 1, 4.0, " "),
        (EDIT_PLUS_PIPELINE, [(64, 64), (112, 80)], 48, 64, 11, 3.0, None),
        ("2511", [(96, 64)], 64, 64, 5, 4.0, " "),
    ],
)
def test_edit_equals_the_stock_pipeline(
    pipes: dict[str, Any],
    pipeline: str,
    references: list[tuple[int, int]],
    width: int,
    height: int,
    seed: int,
    cfg: float,
    negative: str | None,
) -> None:
    pipe = pipes[pipeline]
    pipeline = EDIT_PLUS_PIPELINE if pipeline == "2511" else pipeline
    images = [gradient(w, h, index) for index, (w, h) in enumerate(references)]
    prompt = "make the sky a red painting of a house"
    mine = ours(pipe, pipeline, prompt, images, width, height, seed, cfg, negative)
    stock = theirs(pipe, pipeline, prompt, images, width, height, seed, cfg, negative)
    assert mine.size == stock.size == (width, height)
    assert difference(mine, stock) <= 1


def test_the_reference_image_steers_the_edit(pipes: dict[str, Any]) -> None:
    """The reference image reaches the transformer both ways: through the vision tower's tokens in the prompt
    embeddings and as reference latents. (The tiny random model's pixels barely show it, so latents are compared.)"""
    pipe = pipes[EDIT_PIPELINE]
    dark, light = Image.new("RGB", (96, 64), (0, 0, 0)), Image.new("RGB", (96, 64), (255, 255, 255))

    def run(seen: Image.Image, encoded: Image.Image) -> torch.Tensor:
        embeds, _ = edit.encode_prompt(pipe.text_encoder, pipe.processor, EDIT_PIPELINE, "make it blue", [seen], "cpu")
        return generation.denoise(
            pipe.transformer,
            pipe.scheduler,
            prompt_embeds=embeds,
            width=64,
            height=64,
            steps=STEPS,
            seed=0,
            device="cpu",
            dtype=torch.float32,
            true_cfg_scale=1.0,
            reference_latents=[edit.encode_reference(pipe.vae, encoded)],
        )

    base = run(dark, dark)
    assert (run(light, dark) - base).abs().max() > 1e-3  # the vision tower's tokens
    assert (run(dark, light) - base).abs().max() > 1e-3  # the reference latents


def test_reference_sizes_are_the_pipelines() -> None:
    assert edit.reference_size(96, 64) == (1248, 832)
    assert edit.reference_size(64, 64) == (1024, 1024)
    assert edit.reference_size(96, 64, 384 * 384) == (480, 320)


@pytest.mark.parametrize(("pipeline", "count"), [(EDIT_PIPELINE, 0), (EDIT_PIPELINE, 2), (EDIT_PLUS_PIPELINE, 0)])
def test_a_wrong_reference_count_is_refused(pipeline: str, count: int) -> None:
    with pytest.raises(ValueError, match="reference image"):
        edit.check_references(pipeline, count)


@pytest.mark.parametrize(
    ("pipeline", "sizes"), [(EDIT_PIPELINE, [(96, 64)]), (EDIT_PLUS_PIPELINE, [(80, 112), (64, 64)])]
)
def test_the_text_encoders_attention_calls_are_the_listed_ones(
    pipes: dict[str, Any], monkeypatch: pytest.MonkeyPatch, pipeline: str, sizes: list[tuple[int, int]]
) -> None:
    """The node's facts (edit.prompt_tokens, edit.vision_patches) make the estimator list the calls the Edit
    encoding makes: the vision tower's windowed and full-image calls, then the causal text layers."""
    import torch.nn.functional as F

    from invokeai.backend.cache.estimate import CallFacts
    from invokeai.backend.families.qwen_image import estimators

    pipe = pipes[pipeline]
    images = [gradient(w, h, index) for index, (w, h) in enumerate(sizes)]
    facts = CallFacts(
        torch.device("cpu"),
        torch.float32,
        prompt_tokens=edit.prompt_tokens(pipe.processor, pipeline, "make it blue", images),
        text_padded=False,
        vision_patches=tuple(edit.vision_patches(pipe.processor, pipeline, images)),
    )
    listed: Counter[tuple] = Counter()
    for call in estimators.text_encoder(pipe.text_encoder.config, facts).attention_calls:
        listed[(call.num_heads, call.query_len, call.key_len, call.head_dim, call.has_attn_mask, call.is_causal)] += (
            call.count
        )
    recorded: Counter[tuple] = Counter()
    real = F.scaled_dot_product_attention

    def recorder(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):  # type: ignore[no-untyped-def]
        heads = query.shape[0] * query.shape[1]
        recorded[(heads, query.shape[-2], key.shape[-2], query.shape[-1], attn_mask is not None, bool(is_causal))] += 1
        return real(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorder)
    edit.encode_prompt(pipe.text_encoder, pipe.processor, pipeline, "make it blue", images, "cpu")
    monkeypatch.setattr(F, "scaled_dot_product_attention", real)
    assert recorded == listed
    assert len(listed) > 2  # windows, whole images and the text


def test_the_edit_demo_builds_the_same_bytes_and_probes_as_an_edit_model(
    demo_qwen_image_edit: Path, tmp_path: Path
) -> None:
    from invokeai.backend.families.qwen_image import demo
    from invokeai.backend.models.probe import probe_model

    again = tmp_path / demo.EDIT_NAME
    demo.build_edit(again)
    files = sorted(p for p in demo_qwen_image_edit.rglob("*") if p.is_file())
    assert [p.relative_to(demo_qwen_image_edit) for p in files] == sorted(
        p.relative_to(again) for p in again.rglob("*") if p.is_file()
    )
    for path in files:
        assert path.read_bytes() == (again / path.relative_to(demo_qwen_image_edit)).read_bytes(), path.name
    probe = probe_model(demo_qwen_image_edit)
    assert (probe.family, probe.type, probe.format) == ("qwen-image", "main", "diffusers")
