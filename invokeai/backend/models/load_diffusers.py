"""Load one component of a diffusers pipeline folder, with the class model_index.json names for it."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import torch

from .errors import UnsupportedModelError

# Classes are imported by the names a folder's model_index.json gives; only these libraries may be named.
ALLOWED_LIBRARIES = ("diffusers", "transformers")


def component_class(folder: Path, component: str) -> type:
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    entry = index.get(component)
    if not (isinstance(entry, list) and len(entry) == 2 and all(entry)):
        raise UnsupportedModelError(f"{folder.name}: model_index.json names no {component}")
    library, class_name = entry
    if library not in ALLOWED_LIBRARIES:
        raise UnsupportedModelError(f"{folder.name}: {component} comes from {library!r}, not diffusers/transformers")
    cls = getattr(importlib.import_module(library), class_name, None)
    if not isinstance(cls, type):
        raise UnsupportedModelError(f"{folder.name}: {library} has no class {class_name!r} for {component}")
    return cls


def load_from_folder(folder: Path, component: str, cls: type, dtype: torch.dtype) -> Any:
    """`cls.from_pretrained(folder, subfolder=component)` offline; models get `dtype`, tokenizers and schedulers
    take none."""
    kwargs: dict[str, Any] = {"subfolder": component, "local_files_only": True}
    if issubclass(cls, torch.nn.Module):
        # transformers 5 names the argument `dtype`; diffusers still calls it `torch_dtype`.
        kwargs["torch_dtype" if cls.__module__.startswith("diffusers") else "dtype"] = dtype
    return cls.from_pretrained(str(folder), **kwargs)


def load_diffusers_component(folder: Path, component: str, dtype: torch.dtype) -> Any:
    return load_from_folder(folder, component, component_class(folder, component), dtype)
