"""What a path on disk is: family, type, format and config variant, from headers and config files only.

Supported is what the family registry declares: a diffusers pipeline folder whose model_index.json names a family's
pipeline class (and passes the family's folder check), and single files (safetensors or GGUF) that one of the
families' file rules recognises, matched to one of its shipped configs by tensor shapes. Anything else raises
UnsupportedModelError with the reason. No weights are read: the installer calls this on whatever a user points at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from invokeai.backend.families import FAMILIES, family_for_pipeline, pipeline_classes
from invokeai.backend.families.unsupported import unsupported_layout

from .config_variants import match_variant
from .errors import UnsupportedModelError
from .gguf_header import is_gguf, read_gguf_header
from .safetensors_header import read_safetensors_header

WEIGHT_SUFFIXES = (".safetensors", ".bin")
_CONTAINERS = {"safetensors": "safetensors", "gguf": "GGUF"}
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")


@dataclass(frozen=True)
class ProbeResult:
    path: Path
    family: str  # a registered family's name
    type: str  # "main" (a whole pipeline) | the one component's type ("transformer", "vae" ...): FileRule.type
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
    family = family_for_pipeline(class_name) if isinstance(class_name, str) else None
    if family is None:
        supported = ", ".join(sorted(pipeline_classes()))
        raise UnsupportedModelError(f"{path.name}: pipeline class {class_name!r} is not supported ({supported} are)")
    for component in family.components:
        entry = index.get(component)
        if not (isinstance(entry, list) and len(entry) == 2 and all(entry)):
            raise UnsupportedModelError(f"{path.name}: model_index.json names no {component}")
        folder = path / component
        if not folder.is_dir():
            raise UnsupportedModelError(f"{path.name}: component folder {component}/ is missing")
        if component in family.module_components and not any(
            file.suffix in WEIGHT_SUFFIXES for file in folder.iterdir() if file.is_file()
        ):
            raise UnsupportedModelError(f"{path.name}: {component}/ holds no weights")
    if family.folder_check is not None:
        configs = {
            component: _component_config(path, component, "scheduler_config.json" if component == "scheduler" else None)
            for component in family.checked_configs
        }
        # What the folder's pipeline flags allow may differ (a UNet that only runs with one of them set).
        configs["model_index"] = family.options_in(index)
        differences = family.folder_check(configs)
        if differences:
            raise UnsupportedModelError(
                f"{path.name}: not a {family.title} pipeline the {family.name} nodes can run: " + "; ".join(differences)
            )
    size = sum(file.stat().st_size for file in path.rglob("*") if file.is_file())
    return ProbeResult(path, family.name, "main", "diffusers", None, size)


def _component_config(path: Path, component: str, name: str | None = None) -> dict:
    name = name or "config.json"
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
        header = read_gguf_header(path)
        return _probe_single_file(path, size, "gguf", header.tensors, f"architecture {header.architecture!r}, ")
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
    return _probe_single_file(path, size, "safetensors", header.tensors)


def _probe_single_file(path: Path, size: int, container: str, tensors: dict, about: str = "") -> ProbeResult:
    """The family file rule for this container that recognises the tensor names, with its config variant."""
    rules = [(family, rule) for family in FAMILIES for rule in family.files]
    refusals: list[str] = []
    for family, rule in rules:
        if rule.container == container and rule.matches(tensors):
            shapes = {rule.canonical_name(name): tuple(tensor.shape) for name, tensor in tensors.items()}
            try:
                variant = match_variant(family.config_variants, shapes, rule.signature, f"{path.name} ({rule.what})")
            except UnsupportedModelError as error:
                # Recognised by name, refused by shape: another family's rule may still take the file.
                note = rule.refusal(shapes) if rule.refusal is not None else None
                refusals.append(f"{path.name}: {note} ({error})" if note else str(error))
                continue
            return ProbeResult(path, family.name, rule.type, rule.format, variant.name, size)
    if refusals:
        raise UnsupportedModelError("; ".join(refusals))
    elsewhere = [rule for _, rule in rules if rule.container != container and rule.matches(tensors)]
    if elsewhere:
        rule = elsewhere[0]
        raise UnsupportedModelError(
            f"{path.name}: a {rule.what} is supported as {_CONTAINERS[rule.container]} only, "
            f"not {_CONTAINERS[container]}"
        )
    looks_like = unsupported_layout(tensors, [layout for family in FAMILIES for layout in family.lookalikes])
    if looks_like is not None:
        raise UnsupportedModelError(f"{path.name}: this looks like {looks_like}, which is not supported yet")
    kinds = [rule.what for _, rule in rules if rule.container == container]
    raise UnsupportedModelError(
        f"{path.name}: the tensors are in no single-file layout this server runs as {_CONTAINERS[container]} "
        f"({', '.join(kinds) or 'none'}); found {about}{_prefix_summary(tensors)}"
    )


def _prefix_summary(names: dict[str, object], limit: int = 5) -> str:
    prefixes = sorted({name.split(".", 1)[0] + "." for name in names})
    shown = ", ".join(f"{p}*" for p in prefixes[:limit])
    return f"tensor prefixes {shown}" + (f" and {len(prefixes) - limit} more" if len(prefixes) > limit else "")
