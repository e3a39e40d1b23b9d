"""probe_model: every supported kind, and every refusal with its reason."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from models_testlib import DemoBuild

from invokeai.backend.families import config_variant
from invokeai.backend.families.sd1 import layout as sd1
from invokeai.backend.models.errors import UnsupportedModelError
from invokeai.backend.models.probe import probe_model
from invokeai.backend.models.safetensors_header import DTYPE_SIZES


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _refused(path: Path, reason: str) -> str:
    with pytest.raises(UnsupportedModelError, match=reason) as info:
        probe_model(path)
    return info.value.reason


def _write_safetensors(path: Path, header: dict, data_size: int) -> Path:
    """A safetensors file with this header; the data is a hole (sparse), so real-sized tensors cost no disk."""
    raw = json.dumps(header).encode()
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        file.truncate(8 + len(raw) + data_size)
    return path


def _header_for(shapes: dict[str, tuple[int, ...]], dtype: str = "F16") -> tuple[dict, int]:
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * DTYPE_SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    return header, offset


def test_diffusers_folders(demo_build: DemoBuild) -> None:
    sd = probe_model(demo_build.sd1)
    assert (sd.family, sd.type, sd.format, sd.config_variant) == ("sd-1", "main", "diffusers", None)
    assert sd.size == _tree_size(demo_build.sd1) and sd.path == demo_build.sd1
    krea = probe_model(demo_build.krea2)
    assert (krea.family, krea.type, krea.format, krea.config_variant) == ("krea2", "main", "diffusers", None)
    assert krea.size == _tree_size(demo_build.krea2)


def test_gguf_transformer(demo_build: DemoBuild) -> None:
    result = probe_model(demo_build.gguf)
    assert (result.family, result.type, result.format) == ("krea2", "transformer", "gguf")
    assert result.config_variant == "krea2-demo"
    assert result.size == demo_build.gguf.stat().st_size


def test_sd1_checkpoint(demo_checkpoint: Path) -> None:
    result = probe_model(demo_checkpoint)
    assert (result.family, result.type, result.format) == ("sd-1", "main", "checkpoint")
    assert result.config_variant == "sd-1-demo"


def test_full_size_sd15_checkpoint_gets_the_real_config(tmp_path: Path) -> None:
    signature = sd1.checkpoint_signature(config_variant("sd-1"))
    header, size = _header_for({name: shape for name, shape in signature.items() if shape is not None})
    path = _write_safetensors(tmp_path / "v1-5-pruned-emaonly.safetensors", header, size)
    assert probe_model(path).config_variant == "sd-1"


def test_probe_reads_headers_only_and_imports_no_diffusers(demo_build: DemoBuild, demo_checkpoint: Path) -> None:
    code = (
        "import sys\nfrom invokeai.backend.models.probe import probe_model\n"
        f"for p in {[str(demo_build.sd1), str(demo_build.gguf), str(demo_checkpoint)]!r}: probe_model(p)\n"
        "assert 'diffusers' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[3])


def test_refusals_of_paths(tmp_path: Path) -> None:
    assert "not found" in _refused(tmp_path / "missing.safetensors", "not found")
    _refused(tmp_path, "has no model_index.json")
    (tmp_path / "notes.txt").write_text("hello, not a model")
    _refused(tmp_path / "notes.txt", "not a safetensors or GGUF file")
    (tmp_path / "empty.safetensors").write_bytes(b"")
    _refused(tmp_path / "empty.safetensors", "empty file")
    (tmp_path / "model.ckpt").write_bytes(b"\x80\x02}q\x00.")
    _refused(tmp_path / "model.ckpt", r"pickle checkpoints \(.ckpt\) are not supported")
    (tmp_path / "fake.gguf").write_bytes(b"GGUG" + bytes(60))
    _refused(tmp_path / "fake.gguf", "not a GGUF file")


def test_refusals_of_folders(demo_build: DemoBuild, tmp_path: Path) -> None:
    folder = tmp_path / "pipe"
    shutil.copytree(demo_build.sd1, folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text("{not json")
    _refused(folder, "model_index.json is unreadable")
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": "StableDiffusion3Pipeline"}))
    _refused(folder, "pipeline class 'StableDiffusion3Pipeline' is not supported")
    (folder / "model_index.json").write_text(json.dumps(index))
    shutil.rmtree(folder / "vae")
    _refused(folder, "component folder vae/ is missing")
    (folder / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    _refused(folder, "unet/ holds no weights")
    del index["tokenizer"]
    (folder / "model_index.json").write_text(json.dumps(index))
    _refused(folder, "model_index.json names no tokenizer")


def test_refusals_of_corrupt_safetensors(demo_checkpoint: Path, tmp_path: Path) -> None:
    data = demo_checkpoint.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: len(data) - 1000])
    _refused(cut, "truncated safetensors file: tensor '.*' ends at byte")
    cut.write_bytes(data[: 8 + length // 2])
    _refused(cut, "header length .* is beyond the file size")
    cut.write_bytes(data[:5])
    _refused(cut, "no header length")
    garbled = tmp_path / "garbled.safetensors"
    garbled.write_bytes(data[:8] + b"#" + data[9:])
    _refused(garbled, "header is not valid JSON")
    header, size = _header_for({"model.diffusion_model.x": (4, 4)})
    header["model.diffusion_model.x"]["data_offsets"] = [0, 16]
    _refused(_write_safetensors(tmp_path / "wrong.safetensors", header, size), "size 16 does not match its shape")
    header["model.diffusion_model.x"]["dtype"] = "F99"
    _refused(_write_safetensors(tmp_path / "dtype.safetensors", header, size), "unknown dtype 'F99'")


def test_refusals_of_other_layouts(demo_build: DemoBuild, demo_checkpoint: Path, tmp_path: Path) -> None:
    reason = _refused(
        demo_build.sd1 / "unet" / "diffusion_pytorch_model.safetensors",
        "in no single-file layout this server runs as safetensors \\(SD-1 checkpoint",
    )
    assert "tensor prefixes conv_in.*" in reason
    # An SD-2 checkpoint: OpenCLIP text encoder under cond_stage_model.model.
    header, size = _header_for(
        {"model.diffusion_model.out.2.weight": (4, 320, 3, 3), "first_stage_model.quant_conv.weight": (8, 8, 1, 1)}
        | {"cond_stage_model.model.token_embedding.weight": (49408, 1024)}
    )
    sd2 = _write_safetensors(tmp_path / "sd2.safetensors", header, size)
    _refused(sd2, "looks like a Stable Diffusion 2.x checkpoint")
    header, size = _header_for({"text_fusion.projector.weight": (1, 3), "img_in.weight": (64, 64)})
    header |= _header_for({"txt_in.linear_1.weight": (64, 32)})[0]
    krea = _write_safetensors(tmp_path / "krea.safetensors", header, size)
    _refused(krea, "Krea-2 transformer is supported as GGUF only")


def test_refusals_of_gguf(demo_build: DemoBuild, tmp_path: Path) -> None:
    data = demo_build.gguf.read_bytes()
    for keep in (len(data) - 1, len(data) // 2, 200):
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(data[:keep])
        _refused(cut, "corrupt or truncated GGUF file|truncated GGUF file")
    other = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(str(other), arch="llama")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _refused(
        other,
        "in no single-file layout this server runs as GGUF \\(Krea-2 transformer.*\\); found architecture 'llama'",
    )


def _pipeline_with(demo_build: DemoBuild, tmp_path: Path, component: str, name: str, **changes: object) -> Path:
    """demo-sd1 copied, with one component's config changed (weights untouched: the probe reads configs only)."""
    folder = tmp_path / f"changed-{component}"
    if not folder.exists():
        shutil.copytree(demo_build.sd1, folder)
    file = folder / component / name
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))
    return folder


@pytest.mark.parametrize(
    ("component", "name", "changes", "reason"),
    [
        ("unet", "config.json", {"in_channels": 9}, r"takes 9 input channels \(an inpainting UNet"),
        ("unet", "config.json", {"time_cond_proj_dim": 256}, r"LCM-distilled \(time_cond_proj_dim 256\)"),
        ("scheduler", "scheduler_config.json", {"prediction_type": "v_prediction"}, "predicts 'v_prediction'"),
        ("unet", "config.json", {"cross_attention_dim": 1024}, "1024-wide text embeddings"),
        ("unet", "config.json", {"cross_attention_dim": 48}, "cross_attention_dim 48 is not its text encoder's"),
    ],
    ids=["inpainting", "lcm", "v-prediction", "sd-2 text width", "mismatched widths"],
)
def test_a_pipeline_folder_of_another_kind_is_refused_naming_the_difference(
    demo_build: DemoBuild, tmp_path: Path, component: str, name: str, changes: dict, reason: str
) -> None:
    # Each passes StableDiffusionPipeline's class check, and went wrong later: at denoise, or sampling wrongly.
    folder = _pipeline_with(demo_build, tmp_path, component, name, **changes)
    assert "not a Stable Diffusion 1.x pipeline the sd-1 nodes can run" in _refused(folder, reason)


def test_a_folder_with_an_unreadable_unet_config_is_refused(demo_build: DemoBuild, tmp_path: Path) -> None:
    folder = _pipeline_with(demo_build, tmp_path, "unet", "config.json")
    (folder / "unet" / "config.json").write_text("[1, 2")
    _refused(folder, "unet/config.json is unreadable")
    (folder / "unet" / "config.json").write_text("[1, 2]")
    _refused(folder, "unet/config.json is not a JSON object")


@pytest.mark.parametrize(
    ("names", "family"),
    [
        (
            [
                "conditioner.embedders.0.model.token_embedding.weight",
                "first_stage_model.decoder.conv_out.weight",
                "model.diffusion_model.out.2.weight",
            ],
            "SDXL refiner",
        ),
        (["double_blocks.0.img_attn.qkv.weight", "single_blocks.0.linear1.weight", "img_in.weight"], "FLUX.1"),
        (["model.diffusion_model.double_blocks.0.img_attn.qkv.weight"], "FLUX.1"),
    ],
    ids=["sdxl refiner", "flux", "flux with prefix"],
)
def test_a_single_file_of_another_family_says_which_it_looks_like(
    names: list[str], family: str, tmp_path: Path
) -> None:
    header, size = _header_for({name: (4, 4) for name in names})
    path = _write_safetensors(tmp_path / "other.safetensors", header, size)
    _refused(path, f"looks like an? {family}")
