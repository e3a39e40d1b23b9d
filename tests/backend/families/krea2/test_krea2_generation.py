"""Krea-2 generation steps against diffusers' Krea2Pipeline (same image within 1/255 per pixel), and the attention
controls the denoise loop carries: the INVOKE_KREA2_SDPA_BACKEND window and the per-step benchmark."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

from invokeai.backend.attention import attention_caller, attention_stats, install_attention
from invokeai.backend.attention.benchmarking import WINDOW_MODES, StepBenchmark, step_benchmark
from invokeai.backend.attention.policy import read_flags
from invokeai.backend.attention.testing import pristine_attention
from invokeai.backend.families.krea2 import generation as krea2
from invokeai.backend.families.krea2 import scheduler as krea2_scheduler
from invokeai.backend.families.krea2.attention import EXPANDED, Krea2GroupedQueryAttnProcessor
from invokeai.backend.families.krea2.generation import WINDOW_ENV, window_mode_from_env

os.environ["HF_HUB_OFFLINE"] = "1"

SEED = 7
STEPS = 4
SIZE = 64
SHORT_TEXT = 16  # max_sequence_length for the tests that do not compare against the pipeline's default


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(autouse=True)
def clean_attention(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No window unless a test sets one, and the process's SDPA and kernel flags as they were afterwards."""
    monkeypatch.delenv(WINDOW_ENV, raising=False)
    with pristine_attention():
        yield


@pytest.fixture(scope="session")
def krea2_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """demo-krea2, built once per session: its folder, pipeline settings and components (load_component)."""
    from invokeai.backend.models.demo import build_demo_models
    from invokeai.backend.models.loaders import components_of, load_component
    from invokeai.backend.models.probe import probe_model

    (model,) = build_demo_models(tmp_path_factory.mktemp("generation-krea2"), names=("demo-krea2",))
    probe = probe_model(model.path)
    parts = {name: load_component(probe, name) for name in components_of(probe)}
    index = json.loads((model.path / "model_index.json").read_text(encoding="utf-8"))
    return {"path": model.path, "settings": krea2.Krea2Settings.from_model_index(index), **parts}


@pytest.fixture(scope="session")
def stock_pipeline(krea2_model: dict[str, Any]) -> Any:
    """Krea2Pipeline over the same components, except a transformer of its own that keeps the stock processor."""
    from diffusers import Krea2Pipeline

    from invokeai.backend.models.loaders import load_component
    from invokeai.backend.models.probe import probe_model

    pipe = Krea2Pipeline(
        scheduler=krea2_model["scheduler"],
        vae=krea2_model["vae"],
        text_encoder=krea2_model["text_encoder"],
        tokenizer=krea2_model["tokenizer"],
        transformer=load_component(probe_model(krea2_model["path"]), "transformer"),
        text_encoder_select_layers=krea2_model["settings"].select_layers,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _encode(model: dict[str, Any], prompt: str, max_sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    return krea2.encode_prompt(
        model["text_encoder"],
        model["tokenizer"],
        prompt,
        "cpu",
        select_layers=model["settings"].select_layers,
        max_sequence_length=max_sequence_length,
    )


def _denoise(
    model: dict[str, Any],
    prompt: str,
    guidance: float,
    max_sequence_length: int = SHORT_TEXT,
    node: str = "krea2_denoise",
    **kwargs: Any,
) -> torch.Tensor:
    """Encode (outside), then denoise with attention calls counted under `node`."""
    embeds, mask = _encode(model, prompt, max_sequence_length)
    negative, negative_mask = _encode(model, "", max_sequence_length) if guidance > 0 else (None, None)
    with attention_caller(node):
        return krea2.denoise(
            model["transformer"],
            krea2_scheduler.make_scheduler("euler", dict(model["scheduler"].config)),
            prompt_embeds=embeds,
            prompt_mask=mask,
            negative_embeds=negative,
            negative_mask=negative_mask,
            width=SIZE,
            height=SIZE,
            steps=STEPS,
            guidance_scale=guidance,
            seed=SEED,
            device="cpu",
            dtype=torch.float32,
            is_distilled=model["settings"].is_distilled,
            patch_size=model["settings"].patch_size,
            **kwargs,
        )


def _pixels(image: Any) -> np.ndarray:
    return np.asarray(image).astype(np.int16)


@pytest.mark.parametrize(
    ("guidance", "max_sequence_length"),
    [(4.5, krea2.MAX_SEQUENCE_LENGTH), (0.0, SHORT_TEXT)],
    ids=["guided-default-length", "unguided-short"],
)
def test_image_equals_the_stock_pipeline(
    krea2_model: dict[str, Any], stock_pipeline: Any, guidance: float, max_sequence_length: int
) -> None:
    expected = stock_pipeline(
        "a red cat",
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=guidance,
        max_sequence_length=max_sequence_length,
        generator=torch.Generator().manual_seed(SEED),
    ).images[0]
    steps: list[tuple[int, int, tuple[int, ...]]] = []
    latents = _denoise(
        krea2_model,
        "a red cat",
        guidance,
        max_sequence_length,
        on_step=lambda step, total, current: steps.append((step, total, tuple(current.shape))),
    )
    image = krea2.vae_decode(krea2_model["vae"], latents)
    assert image.size == (SIZE, SIZE) and image.mode == "RGB"
    assert np.abs(_pixels(image) - _pixels(expected)).max() <= 1
    assert steps == [(step, STEPS, (1, 16, SIZE // 8, SIZE // 8)) for step in range(1, STEPS + 1)]
    # The comparison is against the stock processor, ours ran here.
    assert all(
        type(m.processor).__name__ == "Krea2AttnProcessor"
        for m in stock_pipeline.transformer.modules()
        if hasattr(m, "processor")
    )
    assert isinstance(krea2_model["transformer"].transformer_blocks[0].attn.processor, Krea2GroupedQueryAttnProcessor)


def test_prompt_encoding_equals_the_pipelines(krea2_model: dict[str, Any], stock_pipeline: Any) -> None:
    with torch.no_grad():
        expected, expected_mask = stock_pipeline.encode_prompt("a red cat", max_sequence_length=SHORT_TEXT)
    embeds, mask = _encode(krea2_model, "a red cat", SHORT_TEXT)
    assert torch.equal(embeds, expected) and torch.equal(mask, expected_mask)
    assert embeds.shape == (1, SHORT_TEXT, len(krea2_model["settings"].select_layers), 32)
    # The kept sequence is the prompt plus the 5 suffix tokens; the rest is padding.
    assert int(mask.sum()) == len(krea2_model["tokenizer"]("a red cat").input_ids) + krea2.TEMPLATE_SUFFIX_TOKENS


def test_the_prompt_changes_the_image(krea2_model: dict[str, Any]) -> None:
    cat = krea2.vae_decode(krea2_model["vae"], _denoise(krea2_model, "a red cat", 4.5))
    house = krea2.vae_decode(krea2_model["vae"], _denoise(krea2_model, "a blue house", 4.5))
    assert np.abs(_pixels(cat) - _pixels(house)).max() > 0


def test_a_tokenizer_that_would_cut_the_prompt_away_is_refused(krea2_model: dict[str, Any]) -> None:
    def longer(text: Any, **kwargs: Any) -> Any:
        encoded = krea2_model["tokenizer"](text, **kwargs)
        encoded["input_ids"] = [0, *encoded["input_ids"]]
        return encoded

    with pytest.raises(ValueError, match="system prefix to 35 tokens, not 34"):
        krea2.encode_prompt(krea2_model["text_encoder"], longer, "a red cat", "cpu", select_layers=(1, 2, 3))


def test_guidance_needs_the_negative_conditioning(krea2_model: dict[str, Any]) -> None:
    embeds, mask = _encode(krea2_model, "a red cat", SHORT_TEXT)
    with pytest.raises(ValueError, match="needs negative_embeds"):
        krea2.denoise(
            krea2_model["transformer"],
            krea2_model["scheduler"],
            prompt_embeds=embeds,
            prompt_mask=mask,
            width=SIZE,
            height=SIZE,
            steps=STEPS,
            guidance_scale=4.5,
            seed=SEED,
            device="cpu",
            dtype=torch.float32,
        )


def test_helpers_match_the_pipelines() -> None:
    from diffusers import Krea2Pipeline
    from diffusers.pipelines.krea2.pipeline_krea2 import calculate_shift

    assert torch.equal(
        krea2.position_ids(7, 3, 5, torch.device("cpu")), Krea2Pipeline.prepare_position_ids(7, 3, 5, "cpu")
    )
    config = {"base_image_seq_len": 256, "max_image_seq_len": 6400, "base_shift": 0.5, "max_shift": 1.15}
    for tokens in (16, 256, 4096, 9216):
        assert krea2.image_shift(tokens, config) == pytest.approx(calculate_shift(tokens, 256, 6400, 0.5, 1.15))
    latents = torch.randn(1, 16, 8, 12)
    assert torch.equal(krea2.unpack_latents(krea2.pack_latents(latents, 2), 64, 96, 2), latents)


def test_unset_or_empty_means_the_ranked_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WINDOW_ENV, raising=False)
    assert window_mode_from_env() is None
    monkeypatch.setenv(WINDOW_ENV, " ")
    assert window_mode_from_env() is None


@pytest.mark.parametrize("mode", ["cudnn", "efficient", "flash", "math", "priority-cudnn"])
def test_valid_modes_are_read(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WINDOW_ENV, mode)
    assert window_mode_from_env() == mode


@pytest.mark.parametrize("bad", ["CUDNN", "mem_efficient", "priority-flash", "auto"])
def test_any_other_value_raises_naming_the_valid_ones(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WINDOW_ENV, bad)
    with pytest.raises(ValueError) as error:
        window_mode_from_env()
    assert WINDOW_ENV in str(error.value) and all(mode in str(error.value) for mode in WINDOW_MODES)


def test_the_window_is_reported_under_the_variable_that_opened_it(
    krea2_model: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A pin on the CPU standing in for a GPU: the math window outranks it, and the report names the variable.
    from invokeai.backend import devices

    monkeypatch.setattr(devices, "is_reported_tensor", lambda tensor: True)
    monkeypatch.setattr(devices, "has_reported_device", lambda: True)
    install_attention("efficient")
    monkeypatch.setenv(WINDOW_ENV, "math")
    _denoise(krea2_model, "a red cat", 0.0)
    # (The text encoding before the loop runs outside the window, on the CPU's flash kernel: reported as such.)
    (report,) = [r for r in attention_stats().reports if r.node_type == "krea2_denoise"]
    assert (report.node_type, report.serving, report.reason) == ("krea2_denoise", "MATH", "window")
    assert f"the exclusive {WINDOW_ENV}=math window switched it off" in report.message


def test_settings_come_from_model_index(krea2_model: dict[str, Any]) -> None:
    assert krea2_model["settings"] == krea2.Krea2Settings(select_layers=(1, 2, 3), is_distilled=False, patch_size=2)
    assert krea2.Krea2Settings.from_model_index({}) == krea2.Krea2Settings()


def test_the_math_window_serves_every_transformer_call_on_math(
    krea2_model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    install_attention("auto")
    monkeypatch.setenv(WINDOW_ENV, "math")
    before = read_flags()
    latents = _denoise(krea2_model, "a red cat", 4.5)
    assert torch.isfinite(latents).all()
    # 4 steps x 2 guidance calls x (2 layer-wise + 2 refiner text blocks + 2 main blocks), all on math.
    assert attention_stats().counts["krea2_denoise"] == {"MATH": STEPS * 2 * 6}
    # Grouped heads only on a fused kernel: under math every grouped-query call was expanded.
    policy = krea2_model["transformer"].transformer_blocks[0].attn.processor.policy
    assert set(policy.decisions.values()) == {EXPANDED}
    assert read_flags() == before and attention_stats().window is None


def test_without_the_variable_no_window_is_opened(krea2_model: dict[str, Any]) -> None:
    install_attention("auto")
    _denoise(krea2_model, "a red cat", 0.0)
    # The CPU's own choice (flash) served everything: nothing was forced onto math.
    assert "MATH" not in attention_stats().counts["krea2_denoise"]


def test_an_invalid_value_raises_naming_the_valid_ones(
    krea2_model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    install_attention("auto")
    monkeypatch.setenv(WINDOW_ENV, "fastest")
    steps: list[int] = []
    with pytest.raises(ValueError) as error:
        _denoise(krea2_model, "a red cat", 0.0, on_step=lambda step, total, latents: steps.append(step))
    assert WINDOW_ENV in str(error.value) and all(mode in str(error.value) for mode in WINDOW_MODES)
    assert steps == []


class RecordingBenchmark(StepBenchmark):
    """The step benchmark's interface without CUDA: records what the loop did with it."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"), "math", "test")
        self.events: list[str] = []

    def start(self) -> None:
        self.events.append("start")

    @contextmanager
    def step(self) -> Iterator[None]:
        self.events.append("step")
        yield
        self.step_seconds.append(0.0)

    def log(self) -> dict[str, Any]:
        self.events.append("log")
        return {}


def test_the_step_benchmark_brackets_the_loop(krea2_model: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    install_attention("auto")
    monkeypatch.setenv(WINDOW_ENV, "math")
    recorded = RecordingBenchmark()
    asked: list[torch.device] = []

    def fake_step_benchmark(device: torch.device | str, mode: str | None, label: str) -> StepBenchmark:
        asked.append(torch.device(device))
        assert (mode, label) == ("math", "krea2_denoise")
        return recorded

    monkeypatch.setattr(krea2, "step_benchmark", fake_step_benchmark)
    steps: list[int] = []
    _denoise(
        krea2_model,
        "a red cat",
        4.5,
        on_step=lambda step, total, latents: (steps.append(step), recorded.events.append("on_step")),
    )
    assert asked == [torch.device("cpu")]
    assert recorded.events == ["start", *["step", "on_step"] * STEPS, "log"]


def test_on_the_cpu_the_variable_builds_no_benchmark(
    krea2_model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # step_benchmark's own gate: None unless CUDA, so the default path never synchronises.
    install_attention("auto")
    monkeypatch.setenv(WINDOW_ENV, "priority-cudnn")
    assert step_benchmark("cpu", "priority-cudnn", "krea2_denoise") is None
    assert torch.isfinite(_denoise(krea2_model, "a red cat", 0.0)).all()


def test_the_preview_map_is_fitted_to_the_vae_once(krea2_model: dict[str, Any]) -> None:
    from invokeai.backend.generation.preview import FIT_SIZE

    vae = krea2_model["vae"]
    projection = krea2.preview_projection(vae)
    assert projection.channels == vae.config.z_dim
    assert krea2.preview_projection(vae) is projection  # cached per VAE module
    # Applied to the normalised latents the VAE makes for solid colours it was not fitted on (what the denoiser holds),
    # the map gives the colours back better than the best constant. The demo VAE has random weights, so only somewhat
    # better (0.46 against 0.54 here); a map fitted to unnormalised latents is off by 2.7.
    colours = torch.rand(32, 3, generator=torch.Generator().manual_seed(5)) * 2 - 1
    z_dim = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1)
    with torch.no_grad():
        frames = colours.view(-1, 3, 1, 1, 1).expand(-1, -1, 1, FIT_SIZE, FIT_SIZE).to(vae.dtype)
        latents = (vae.encode(frames).latent_dist.mode()[:, :, 0].float() - mean) / std
    cells = latents.permute(0, 2, 3, 1).reshape(len(colours), -1, z_dim)
    predicted = cells @ projection.weights + projection.bias
    error = (predicted - colours[:, None]).abs().mean()
    constant_error = (colours - colours.mean(dim=0)).abs().mean()
    assert error < constant_error, (float(error), float(constant_error))
