"""Config folders shipped with the package: what `from_single_file(..., config=...)` reads instead of the hub.

Each variant is a diffusers pipeline layout without weights (model_index.json, <component>/config.json, tokenizer
files, scheduler config) in the family's folder (`Family.config_variants`). A family has one variant per
architecture size it supports; which one a single file gets is decided by its tensor shapes (see `match_variant`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UnsupportedModelError

# Files that describe a model rather than hold its weights; anything else is left out of a config folder.
CONFIG_SUFFIXES = (".json", ".txt")


@dataclass(frozen=True)
class ConfigVariant:
    """A shipped config folder: `name` is unique across families (records store it); `path` is the folder."""

    name: str
    family: str
    description: str
    path: Path

    def component_config(self, component: str) -> dict[str, Any]:
        """The component's config.json (scheduler_config.json for the scheduler), parsed."""
        folder = self.path / component
        file = folder / "config.json"
        if not file.exists():
            file = folder / "scheduler_config.json"
        return json.loads(file.read_text(encoding="utf-8"))


# Expected tensor shapes by name; None means the tensor must be absent (how a block count is pinned down).
Signature = Mapping[str, tuple[int, ...] | None]


def signature_mismatch(signature: Signature, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """The first way `shapes` differs from `signature`, or None when they agree."""
    for name, expected in signature.items():
        actual = shapes.get(name)
        if expected is None:
            if actual is not None:
                return f"has {name} (more blocks than this config)"
        elif actual is None:
            return f"lacks {name}"
        elif tuple(actual) != tuple(expected):
            return f"{name} is {list(actual)}, expected {list(expected)}"
    return None


def match_variant(
    variants: Iterable[ConfigVariant],
    shapes: Mapping[str, tuple[int, ...]],
    signature_of: Callable[[ConfigVariant], Signature],
    what: str,
) -> ConfigVariant:
    """The variant whose signature tensors all have the file's shapes. A family's variants are disjoint by
    construction (their conv-in / embedding widths differ), so at most one matches; the first wins if not."""
    reasons = []
    variants = list(variants)
    for variant in variants:
        mismatch = signature_mismatch(signature_of(variant), shapes)
        if mismatch is None:
            return variant
        reasons.append(f"{variant.name}: {mismatch}")
    family = variants[0].family if variants else "its family's"
    raise UnsupportedModelError(f"{what} matches no shipped {family} config ({'; '.join(reasons)})")


def export_config_folder(source: Path, dest: Path) -> list[Path]:
    """Copy a diffusers pipeline folder's configs and tokenizer files, without weights, to `dest`."""
    written = []
    for file in sorted(source.rglob("*")):
        if file.is_file() and file.suffix in CONFIG_SUFFIXES:
            target = dest / file.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, target)
            written.append(target)
    return written
