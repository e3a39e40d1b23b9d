"""Qwen-Image transformer files: ComfyUI's diffusion model (diffusers' names, with and without its
`model.diffusion_model.` prefix) loads bit-equal to the diffusers weights, its fp8-scaled form close to them; GGUF files
in the published layout (Q8_0, Q4_0, Q5_1, BF16) load and compute close to fp32; shapes pick the shipped config and
other families' transformers are not taken for Qwen-Image's; the GGUF demo generates; folders are probed and
checked; the demo builds are deterministic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from invokeai.backend.families.qwen_image import component_files, demo, generation, layout
from invokeai.backend.families.qwen_image.descriptor import CONFIG_VARIANTS, FAMILY, folder_check
from invokeai.backend.models.config_variants import match_variant, signature_mismatch
from invokeai.backend.models.errors import UnsupportedModelError
from invokeai.backend.models.gguf_header import read_gguf_header
from invokeai.backend.models.loaders import load_component
from invokeai.backend.models.probe import probe_model

VARIANTS = {variant.name: variant for variant in CONFIG_VARIANTS}
# Max |output - fp32 output| / max |fp32 output| of the demo transformer, by storage type (measured 0.0063, 0.10,
# 0.043 and 0.0024; ComfyUI's scaled fp8 0.039).
TOLERANCE = {"Q8_0": 0.02, "Q4_0": 0.2, "Q5_1": 0.1, "BF16": 0.01}
FP8_TOLERANCE = 0.08


@pytest.fixture(scope="module")
def transformer() -> Any:
    return demo.build_transformer()


def forward(model: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 24, 64, generator=g)
    text = torch.randn(1, 10, 32, generator=g)
    with torch.inference_mode():
        return model(
            hidden_states=latents,
            encoder_hidden_states=text,
            timestep=torch.tensor([0.3]),
            img_shapes=[[(1, 4, 6)]],
            return_dict=False,
        )[0]


@pytest.mark.parametrize("prefix", ["", layout.PREFIX])
def test_a_comfyui_diffusion_model_file_loads_bit_equal(transformer: Any, tmp_path: Path, prefix: str) -> None:
    path = tmp_path / "qwen_image_demo_bf16.safetensors"
    layout.write_safetensors(transformer, path, prefix=prefix)
    probe = probe_model(path)
    assert (probe.family, probe.type, probe.format, probe.config_variant) == (
        "qwen-image",
        "transformer",
        "checkpoint",
        "qwen-image-demo",
    )
    loaded = load_component(probe, "transformer")
    state = loaded.state_dict()
    assert sorted(state) == sorted(transformer.state_dict())
    for name, tensor in transformer.state_dict().items():
        assert torch.equal(state[name], tensor), name
    assert torch.allclose(forward(loaded), forward(transformer), rtol=0, atol=1e-5)


def test_a_comfyui_fp8_scaled_file_loads_close_to_fp32(transformer: Any, tmp_path: Path) -> None:
    path = tmp_path / "qwen_image_demo_fp8_e4m3fn_scaled.safetensors"
    layout.write_safetensors(transformer, path, prefix=layout.PREFIX, fp8=True)
    probe = probe_model(path)
    assert (probe.family, probe.format, probe.config_variant) == ("qwen-image", "checkpoint", "qwen-image-demo")
    loaded = load_component(probe, "transformer")
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    reference = forward(transformer)
    error = float((forward(loaded) - reference).abs().max() / reference.abs().max())
    assert 0 < error < FP8_TOLERANCE


@pytest.mark.parametrize("quant_type", sorted(TOLERANCE))
def test_a_gguf_file_loads_and_computes_close_to_fp32(transformer: Any, tmp_path: Path, quant_type: str) -> None:
    path = tmp_path / f"qwen-image-demo-{quant_type}.gguf"
    stored = layout.write_gguf(transformer, path, quant_type)
    # As the published files: diffusers' names, every 2-D tensor quantized, norms and biases F32.
    assert stored["transformer_blocks.0.img_mod.1.weight"] == stored["img_in.weight"] == quant_type
    assert stored["txt_norm.weight"] == "F32"
    header = read_gguf_header(path)
    assert header.architecture == layout.GGUF_ARCHITECTURE
    assert header.tensors["transformer_blocks.0.attn.to_q.weight"].shape == (64, 64)
    probe = probe_model(path)
    assert (probe.family, probe.type, probe.format, probe.config_variant) == (
        "qwen-image",
        "transformer",
        "gguf",
        "qwen-image-demo",
    )
    loaded = load_component(probe, "transformer")
    reference = forward(transformer)
    error = float((forward(loaded) - reference).abs().max() / reference.abs().max())
    assert 0 < error < TOLERANCE[quant_type]


def test_the_gguf_demo_generates_close_to_the_fp32_demo(qwen_pipe: Any, tmp_path: Path) -> None:
    """demo-qwen-image-gguf (Q8_0) with demo-qwen-image's text encoder and VAE: the image is near fp32's."""
    path = tmp_path / "demo-qwen-image-gguf.gguf"
    FAMILY.demos[1].build(path)
    probe = probe_model(path)
    assert (probe.type, probe.format, probe.config_variant) == ("transformer", "gguf", "qwen-image-demo")
    quantized = load_component(probe, "transformer")

    def image(model: Any) -> np.ndarray:
        embeds, _ = generation.encode_prompt(qwen_pipe.text_encoder, qwen_pipe.tokenizer, "a red house", "cpu")
        negative, _ = generation.encode_prompt(qwen_pipe.text_encoder, qwen_pipe.tokenizer, " ", "cpu")
        latents = generation.denoise(
            model,
            qwen_pipe.scheduler,
            prompt_embeds=embeds,
            negative_embeds=negative,
            width=64,
            height=64,
            steps=4,
            seed=1,
            device="cpu",
            dtype=torch.float32,
        )
        return np.asarray(generation.vae_decode(qwen_pipe.vae, latents), np.int16)

    difference = np.abs(image(quantized) - image(qwen_pipe.transformer))
    assert 0 < difference.mean() < 3 and difference.max() < 40


def _shapes_of(variant: str) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a ComfyUI file for a shipped config, without weights (meta device)."""
    from diffusers import QwenImageTransformer2DModel

    config = VARIANTS[variant].component_config("transformer")
    with torch.device("meta"):
        model = QwenImageTransformer2DModel.from_config(config)
    return {layout.PREFIX + name: tuple(t.shape) for name, t in model.state_dict().items()}


def test_shapes_pick_the_shipped_config_and_other_transformers_are_refused() -> None:
    full = _shapes_of("qwen-image")
    assert full[layout.PREFIX + "transformer_blocks.59.attn.to_q.weight"] == (3072, 3072)
    canonical = {layout.canonical_name(name): shape for name, shape in full.items()}
    assert layout.is_transformer(full)
    assert match_variant(CONFIG_VARIANTS, canonical, layout.transformer_signature, "file").name == "qwen-image"
    assert signature_mismatch(layout.transformer_signature(VARIANTS["qwen-image-demo"]), canonical) is not None
    fewer = {name: shape for name, shape in canonical.items() if not name.startswith("transformer_blocks.59.")}
    with pytest.raises(UnsupportedModelError, match=r"lacks transformer_blocks\.59\."):
        match_variant(CONFIG_VARIANTS, fewer, layout.transformer_signature, "file")
    guided = {**canonical, "time_text_embed.guidance_embedder.linear_1.weight": (3072, 256)}
    with pytest.raises(UnsupportedModelError, match="guidance_embedder"):
        match_variant(CONFIG_VARIANTS, guided, layout.transformer_signature, "file")


def test_other_families_transformers_are_not_taken_for_qwen_images() -> None:
    from diffusers import FluxTransformer2DModel, Krea2Transformer2DModel, ZImageTransformer2DModel

    from invokeai.backend.families.flux import demo as flux_demo
    from invokeai.backend.families.krea2 import demo as krea2_demo
    from invokeai.backend.families.zimage import demo as zimage_demo

    with torch.device("meta"):
        others = {
            "krea2": Krea2Transformer2DModel(**krea2_demo.KREA2_TRANSFORMER),
            "z-image": ZImageTransformer2DModel(**zimage_demo.TRANSFORMER),
            "flux": FluxTransformer2DModel(**flux_demo.TRANSFORMER),
        }
    for name, model in others.items():
        assert not layout.is_transformer(model.state_dict()), name


def test_the_demo_folder_is_probed_and_changed_ones_refused(demo_qwen_image: Path, tmp_path: Path) -> None:
    probe = probe_model(demo_qwen_image)
    assert (probe.family, probe.type, probe.format) == ("qwen-image", "main", "diffusers")
    configs = {
        name: json.loads((demo_qwen_image / name / "config.json").read_text())
        for name in ("transformer", "vae", "text_encoder")
    }
    configs["scheduler"] = json.loads((demo_qwen_image / "scheduler" / "scheduler_config.json").read_text())
    assert folder_check(configs) == []
    edit = tmp_path / "edit-2511"
    shutil.copytree(demo_qwen_image, edit)
    config_file = edit / "transformer" / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "zero_cond_t": True, "joint_attention_dim": 48}))
    with pytest.raises(
        UnsupportedModelError, match=r"hidden states are 32 wide.*zero_cond_t \(Qwen-Image-Edit-2511.*QwenImagePipeline"
    ):
        probe_model(edit)


def test_demo_builds_are_deterministic(demo_qwen_image: Path, tmp_path: Path) -> None:
    """Same bytes every build: the folder's weights and the GGUF file."""
    again = tmp_path / demo.NAME
    FAMILY.demos[0].build(again)
    for weights in sorted(demo_qwen_image.rglob("*.safetensors")):
        assert weights.read_bytes() == (again / weights.relative_to(demo_qwen_image)).read_bytes(), weights.name
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    FAMILY.demos[1].build(first)
    FAMILY.demos[1].build(second)
    assert first.read_bytes() == second.read_bytes()


@pytest.mark.parametrize(("lm_head", "fp8"), [(False, False), (True, False), (False, True)])
def test_a_comfyui_text_encoder_file_loads_as_the_pipelines_encoder(
    qwen_pipe: Any, tmp_path: Path, lm_head: bool, fp8: bool
) -> None:
    """ComfyUI's qwen_2.5_vl_7b file (the language model under `model.`, the vision tower under `visual.`, with or
    without the head, bf16 or scaled fp8): its hidden states are the pipeline encoder's (fp8: close to them)."""
    path = tmp_path / "qwen_2.5_vl_demo.safetensors"
    component_files.write_comfyui_text_encoder(qwen_pipe.text_encoder, path, lm_head=lm_head, fp8=fp8)
    probe = probe_model(path)
    assert (probe.family, probe.type, probe.format, probe.config_variant) == (
        "qwen-image",
        "qwen_vl_encoder",
        "checkpoint",
        "qwen-image-demo",
    )
    loaded = load_component(probe, "text_encoder")
    mine, _ = generation.encode_prompt(loaded, qwen_pipe.tokenizer, "a red house", "cpu")
    theirs, _ = generation.encode_prompt(qwen_pipe.text_encoder, qwen_pipe.tokenizer, "a red house", "cpu")
    error = float((mine - theirs).abs().max() / theirs.abs().max())
    assert (0 < error < FP8_TOLERANCE) if fp8 else error == 0


def test_a_text_encoder_of_another_size_is_refused_saying_what_it_is(qwen_pipe: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = tmp_path / "qwen_2.5_vl_3b.safetensors"
    component_files.write_comfyui_text_encoder(qwen_pipe.text_encoder, path)
    state = load_file(str(path))
    save_file({k: v for k, v in state.items() if not k.startswith("model.layers.1.")}, str(path))
    with pytest.raises(UnsupportedModelError, match=r"a Qwen2\.5-VL text encoder of hidden size 32 and 1 layers"):
        probe_model(path)


def test_a_comfyui_vae_file_loads_bit_equal(qwen_pipe: Any, tmp_path: Path) -> None:
    path = tmp_path / "qwen_image_vae.safetensors"
    component_files.write_comfyui_vae(qwen_pipe.vae, path)
    probe = probe_model(path)
    assert (probe.family, probe.type, probe.format, probe.config_variant) == (
        "qwen-image",
        "vae",
        "checkpoint",
        "qwen-image-demo",
    )
    loaded = load_component(probe, "vae")
    for name, tensor in qwen_pipe.vae.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    latents = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    mine, theirs = generation.vae_decode(loaded, latents), generation.vae_decode(qwen_pipe.vae, latents)
    assert np.array_equal(np.asarray(mine), np.asarray(theirs))
