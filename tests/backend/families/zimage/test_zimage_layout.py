"""Z-Image transformer files in the original (ComfyUI) names: what `to_original` writes is what diffusers' own
converter reads; safetensors files (original names with and without the checkpoint prefix, diffusers names) load
bit-equal to the diffusers weights; GGUF files (Q8_0, Q4_0, Q5_1, BF16, pad tokens quantized as converters do) load
and compute close to fp32; shapes pick the right shipped config; the demo GGUF generates; folders are probed and
checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from invokeai.backend.families.zimage import demo, generation, layout
from invokeai.backend.families.zimage.descriptor import CONFIG_VARIANTS, FAMILY, folder_check
from invokeai.backend.models.config_variants import match_variant, signature_mismatch
from invokeai.backend.models.errors import UnsupportedModelError
from invokeai.backend.models.gguf_header import read_gguf_header
from invokeai.backend.models.loaders import load_component
from invokeai.backend.models.probe import probe_model

VARIANTS = {variant.name: variant for variant in CONFIG_VARIANTS}
# Max |output - fp32 output| / max |fp32 output| of the demo transformer, by storage type (measured 0.010, 0.13,
# 0.074 and 0.004).
TOLERANCE = {"Q8_0": 0.03, "Q4_0": 0.3, "Q5_1": 0.2, "BF16": 0.01}


@pytest.fixture(scope="module")
def transformer() -> Any:
    return demo.build_transformer()


def forward(model: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    latents = [torch.randn(16, 1, 8, 12, generator=g)]
    captions = [torch.randn(20, 32, generator=g)]
    with torch.inference_mode():
        return model(latents, torch.tensor([0.3]), captions, return_dict=False)[0][0]


def test_original_names_are_what_diffusers_own_converter_reads(transformer: Any) -> None:
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers

    state = transformer.state_dict()
    original = {layout.PREFIX + name: tensor for name, tensor in layout.to_original(state).items()}
    assert "layers.0.attention.qkv.weight" in layout.to_original(state)
    assert not any(".to_q." in name or name.startswith("all_") for name in original)
    converted = convert_z_image_transformer_checkpoint_to_diffusers(dict(original))
    assert sorted(converted) == sorted(state)
    ours = layout.from_original(original)
    for name, tensor in state.items():
        assert torch.equal(converted[name], tensor) and torch.equal(ours[name], tensor), name


@pytest.mark.parametrize(("prefix", "names"), [("", "original"), (layout.PREFIX, "original"), ("", "diffusers")])
def test_a_safetensors_file_loads_bit_equal(transformer: Any, tmp_path: Path, prefix: str, names: str) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "z_image_demo.safetensors"
    if names == "original":
        layout.write_original_safetensors(transformer, path, prefix=prefix)
    else:
        save_file({name: tensor.contiguous() for name, tensor in transformer.state_dict().items()}, str(path))
    probe = probe_model(path)
    assert (probe.family, probe.type, probe.format, probe.config_variant) == (
        "z-image",
        "transformer",
        "checkpoint",
        "zimage-demo",
    )
    loaded = load_component(probe, "transformer")
    state = loaded.state_dict()
    assert sorted(state) == sorted(transformer.state_dict())
    for name, tensor in transformer.state_dict().items():
        assert torch.equal(state[name], tensor), name
    # Equal weights; the outputs only to float rounding: BLAS sums in another order for tensors at other offsets in
    # the file's buffer (the prefix shifts them), 7e-7 measured.
    assert torch.allclose(forward(loaded), forward(transformer), rtol=0, atol=1e-5)


@pytest.mark.parametrize("quant_type", sorted(TOLERANCE))
def test_a_gguf_file_loads_and_computes_close_to_fp32(transformer: Any, tmp_path: Path, quant_type: str) -> None:
    path = tmp_path / f"z_image_demo-{quant_type}.gguf"
    stored = layout.write_original_gguf(transformer, path, quant_type)
    # As the common converters write it: original names, every 2-D tensor quantized (the pad tokens too).
    assert stored["layers.0.attention.qkv.weight"] == stored["x_pad_token"] == quant_type
    assert read_gguf_header(path).tensors["layers.0.attention.qkv.weight"].shape == (3 * 96, 96)
    probe = probe_model(path)
    assert (probe.family, probe.format, probe.config_variant) == ("z-image", "gguf", "zimage-demo")
    loaded = load_component(probe, "transformer")
    reference = forward(transformer)
    error = float((forward(loaded) - reference).abs().max() / reference.abs().max())
    assert 0 < error < TOLERANCE[quant_type]


def test_the_gguf_demo_generates_close_to_the_fp32_demo(zimage_pipe: Any, tmp_path: Path) -> None:
    """demo-zimage-gguf (Q8_0) with demo-zimage's text encoder and VAE: the image is near the fp32 transformer's."""
    path = tmp_path / "demo-zimage-gguf.gguf"
    FAMILY.demos[1].build(path)
    probe = probe_model(path)
    assert (probe.type, probe.format, probe.config_variant) == ("transformer", "gguf", "zimage-demo")
    quantized = load_component(probe, "transformer")

    def image(model: Any) -> np.ndarray:
        embeds = generation.encode_prompt(zimage_pipe.text_encoder, zimage_pipe.tokenizer, "a red house", "cpu")
        negative = generation.encode_prompt(zimage_pipe.text_encoder, zimage_pipe.tokenizer, "", "cpu")
        latents = generation.denoise(
            model,
            zimage_pipe.scheduler,
            prompt_embeds=embeds,
            negative_embeds=negative,
            width=64,
            height=64,
            steps=3,
            seed=1,
            device="cpu",
            dtype=torch.float32,
            guidance_scale=2.0,
        )
        return np.asarray(generation.vae_decode(zimage_pipe.vae, latents), np.int16)

    difference = np.abs(image(quantized) - image(zimage_pipe.transformer))
    assert 0 < difference.mean() < 3 and difference.max() < 40


def _shapes_of(variant: str) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a file in the original names for a shipped config, without weights (meta device)."""
    from diffusers import ZImageTransformer2DModel

    config = VARIANTS[variant].component_config("transformer")
    with torch.device("meta"):
        model = ZImageTransformer2DModel.from_config(config)
    return {layout.PREFIX + name: tuple(t.shape) for name, t in layout.to_original(model.state_dict()).items()}


def test_shapes_pick_the_shipped_config_and_other_layouts_are_refused() -> None:
    turbo = _shapes_of("z-image")
    assert turbo[layout.PREFIX + "layers.29.attention.qkv.weight"] == (3 * 3840, 3840)
    canonical = {layout.canonical_name(name): shape for name, shape in turbo.items()}
    assert layout.is_transformer(turbo)
    chosen = match_variant(CONFIG_VARIANTS, canonical, layout.transformer_signature, "file")
    assert chosen.name == "z-image"
    assert signature_mismatch(layout.transformer_signature(VARIANTS["zimage-demo"]), canonical) is not None
    # One layer fewer: no shipped config.
    fewer = {name: shape for name, shape in canonical.items() if not name.startswith("layers.29.")}
    with pytest.raises(UnsupportedModelError, match=r"lacks layers\.29\."):
        match_variant(CONFIG_VARIANTS, fewer, layout.transformer_signature, "file")
    # Lumina-Image-2.0's NextDiT has the same embedders and refiners, but a SiLU before its layers' modulation.
    lumina = {name.replace("adaLN_modulation.0", "adaLN_modulation.1"): shape for name, shape in turbo.items()}
    assert not layout.is_transformer(lumina)


def test_the_demo_folder_is_probed_and_a_changed_one_refused(demo_zimage: Path, tmp_path: Path) -> None:
    probe = probe_model(demo_zimage)
    assert (probe.family, probe.type, probe.format) == ("z-image", "main", "diffusers")
    configs = {
        name: json.loads((demo_zimage / name / "config.json").read_text())
        for name in ("transformer", "vae", "text_encoder")
    }
    configs["scheduler"] = json.loads((demo_zimage / "scheduler" / "scheduler_config.json").read_text())
    assert folder_check(configs) == []
    omni = tmp_path / "omni"
    shutil.copytree(demo_zimage, omni)
    config_file = omni / "transformer" / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "siglip_feat_dim": 64, "cap_feat_dim": 48}))
    with pytest.raises(UnsupportedModelError, match=r"SigLIP.*text encoder's hidden states are 32 wide"):
        probe_model(omni)


def test_demo_builds_are_deterministic(demo_zimage: Path, tmp_path: Path) -> None:
    """Same bytes every build: the folder's weights and the GGUF file."""
    again = tmp_path / "demo-zimage"
    FAMILY.demos[0].build(again)
    for weights in sorted(demo_zimage.rglob("*.safetensors")):
        assert weights.read_bytes() == (again / weights.relative_to(demo_zimage)).read_bytes(), weights.name
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    FAMILY.demos[1].build(first)
    FAMILY.demos[1].build(second)
    assert first.read_bytes() == second.read_bytes()
