"""What a path on disk is: family, type, format and config variant, from headers and config files only.

Supported: a diffusers pipeline folder (the family comes from model_index.json's pipeline class), a single-file
SD-1.x checkpoint in the original key layout (.safetensors), and a Krea-2 transformer in GGUF. Anything else raises
UnsupportedModelError with the reason. No weights are read: the installer calls this on whatever a user points at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import krea2, sd1
from .config_variants import match_variant
from .errors import UnsupportedModelError
from .gguf_header import is_gguf, read_gguf_header
from .safetensors_header import read_safetensors_header

FAMILY_BY_PIPELINE = {sd1.PIPELINE_CLASS: sd1, krea2.PIPELINE_CLASS: krea2}
WEIGHT_SUFFIXES = (".safetensors", ".bin")
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")


@dataclass(frozen=True)
class ProbeResult:
    path: Path
    family: str  # "sd-1" | "krea2"
    type: str  # "main" (a whole pipeline) | "transformer"
    format: str  # "diffusers" | "checkpoint" | "gguf"
    config_variant: str | None  # shipped config folder a single file loads with; None for a diffusers folder
    size: int  # bytes on disk (all files of a folder)


def probe_model(path: Path) -> ProbeResult:
    path = Path(path)
    if not path.exists():
        raise UnsupportedModelError(f"{path}: not found")
    if path.is_dir():
        return _probe_folder(path)
    if path.is_file():
        return _probe_file(path)
    raise UnsupportedModelError(f"{path}: neither a file nor a folder")


def _probe_folder(path: Path) -> ProbeResult:
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise UnsupportedModelError(f"{path.name}: folder has no model_index.json, so it is not a diffusers pipeline")
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
        class_name = index["_class_name"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise UnsupportedModelError(f"{path.name}: model_index.json is unreadable ({type(exc).__name__})") from None
    family = FAMILY_BY_PIPELINE.get(class_name)
    if family is None:
        supported = ", ".join(sorted(FAMILY_BY_PIPELINE))
        raise UnsupportedModelError(f"{path.name}: pipeline class {class_name!r} is not supported ({supported} are)")
    for component in family.COMPONENTS:
        entry = index.get(component)
        if not (isinstance(entry, list) and len(entry) == 2 and all(entry)):
            raise UnsupportedModelError(f"{path.name}: model_index.json names no {component}")
        folder = path / component
        if not folder.is_dir():
            raise UnsupportedModelError(f"{path.name}: component folder {component}/ is missing")
        if component in family.MODEL_COMPONENTS and not any(
            file.suffix in WEIGHT_SUFFIXES for file in folder.iterdir() if file.is_file()
        ):
            raise UnsupportedModelError(f"{path.name}: {component}/ holds no weights")
    if family is sd1:
        differences = sd1.pipeline_differences(
            _component_config(path, "unet"),
            _component_config(path, "scheduler", "scheduler_config.json"),
            _component_config(path, "text_encoder"),
        )
        if differences:
            raise UnsupportedModelError(
                f"{path.name}: not an SD-1.5 pipeline the sd-1 nodes can run: " + "; ".join(differences)
            )
    size = sum(file.stat().st_size for file in path.rglob("*") if file.is_file())
    return ProbeResult(path, family.FAMILY, "main", "diffusers", None, size)


def _component_config(path: Path, component: str, name: str = "config.json") -> dict:
    file = path / component / name
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UnsupportedModelError(f"{path.name}: {component}/{name} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UnsupportedModelError(f"{path.name}: {component}/{name} is unreadable ({type(exc).__name__})") from None
    if not isinstance(config, dict):
        raise UnsupportedModelError(f"{path.name}: {component}/{name} is not a JSON object")
    return config


def _probe_file(path: Path) -> ProbeResult:
    size = path.stat().st_size
    if size == 0:
        raise UnsupportedModelError(f"{path.name}: empty file")
    if is_gguf(path):
        return _probe_gguf(path, size)
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise UnsupportedModelError(
            f"{path.name}: pickle checkpoints ({suffix}) are not supported, since loading one can run code; "
            "use a .safetensors file"
        )
    if suffix == ".gguf":
        raise UnsupportedModelError(f"{path.name}: not a GGUF file (no GGUF magic)")
    if suffix != ".safetensors":
        # Not named like a model: accept it only if it parses as safetensors, and say plainly if it does not.
        try:
            header = read_safetensors_header(path)
        except UnsupportedModelError:
            raise UnsupportedModelError(f"{path.name}: not a safetensors or GGUF file") from None
    else:
        header = read_safetensors_header(path)
    shapes = {name: tensor.shape for name, tensor in header.tensors.items()}
    missing = sd1.missing_checkpoint_parts(shapes)
    looks_like = _other_single_file_family(shapes)
    if looks_like is not None:
        raise UnsupportedModelError(f"{path.name}: this looks like {looks_like}, which is not supported yet")
    if missing:
        if krea2.is_transformer(shapes):
            raise UnsupportedModelError(f"{path.name}: a Krea-2 transformer is supported as GGUF only, not safetensors")
        raise UnsupportedModelError(
            f"{path.name}: tensors are not in the original SD-1.5 single-file layout: no {', '.join(missing)}; "
            f"found {_prefix_summary(shapes)}"
        )
    variant = match_variant(sd1.FAMILY, shapes, sd1.checkpoint_signature, f"{path.name} (SD-1 checkpoint)")
    return ProbeResult(path, sd1.FAMILY, "main", "checkpoint", variant.name, size)


def _probe_gguf(path: Path, size: int) -> ProbeResult:
    header = read_gguf_header(path)
    if not krea2.is_transformer(header.tensors):
        raise UnsupportedModelError(
            f"{path.name}: GGUF file is not a Krea-2 transformer (architecture {header.architecture!r}, "
            f"{_prefix_summary(header.tensors)}); only Krea-2 transformers are supported as GGUF"
        )
    shapes = {krea2.diffusers_name(name): tensor.shape for name, tensor in header.tensors.items()}
    variant = match_variant(krea2.FAMILY, shapes, krea2.transformer_signature, f"{path.name} (Krea-2 transformer)")
    return ProbeResult(path, krea2.FAMILY, "transformer", "gguf", variant.name, size)


# Tensor names that only single files of families this server does not run yet carry, so a refusal can say which
# family a file looks like rather than only that it is not SD-1.5's layout.
_OTHER_SINGLE_FILE_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "an SDXL checkpoint (a second, OpenCLIP-G text encoder under conditioner.embedders.1)",
        ("conditioner.embedders.1.",),
    ),
    (
        "a FLUX.1 transformer (double_blocks / single_blocks)",
        ("double_blocks.", "model.diffusion_model.double_blocks."),
    ),
    (
        "a Stable Diffusion 2.x checkpoint (an OpenCLIP text encoder under cond_stage_model.model)",
        ("cond_stage_model.model.",),
    ),
)


def _other_single_file_family(names: dict[str, object]) -> str | None:
    for family, prefixes in _OTHER_SINGLE_FILE_FAMILIES:
        if any(name.startswith(prefixes) for name in names):
            return family
    return None


def _prefix_summary(names: dict[str, object], limit: int = 5) -> str:
    prefixes = sorted({name.split(".", 1)[0] + "." for name in names})
    shown = ", ".join(f"{p}*" for p in prefixes[:limit])
    return f"tensor prefixes {shown}" + (f" and {len(prefixes) - limit} more" if len(prefixes) > limit else "")
