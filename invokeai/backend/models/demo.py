"""Tiny random-weight demo models, so the first generation on a fresh machine needs no download.

Each family declares its demo models (`Family.demos`): the real diffusers/transformers architecture with a small
config and seeded random weights; the images are noise-like, but every code path of a real model of the family
runs. Builds are deterministic (same bytes every time) and atomic: everything is built in a hidden folder next to
the destination and renamed into place, so a crash leaves no half-built model under a model's name. This module
reads the registry: no family imports it (their builders seed with `invokeai.backend.models.demo_weights`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from invokeai.backend.families.family import DemoModel, Family
from invokeai.backend.families.registry import FAMILIES

_BUILD_PREFIX = ".demo-build-"


@dataclass(frozen=True)
class BuiltDemo:
    name: str
    family: str
    type: str
    format: str
    description: str
    path: Path


def _demos() -> dict[str, tuple[Family, DemoModel]]:
    return {demo.name: (family, demo) for family in FAMILIES for demo in family.demos}


def demo_names() -> tuple[str, ...]:
    return tuple(_demos())


def demo_target(dest: Path, name: str) -> Path:
    return Path(dest) / _known(name)[1].filename


def _known(name: str) -> tuple[Family, DemoModel]:
    try:
        return _demos()[name]
    except KeyError:
        raise ValueError(f"unknown demo model {name!r}; known: {', '.join(demo_names())}") from None


def build_demo_models(dest: Path, names: tuple[str, ...] | None = None) -> list[BuiltDemo]:
    """Build the demo models `names` (all by default) in `dest`, in order. An existing target is an
    error (nothing is built then): replacing a model that may be installed and in use is the caller's decision. One
    builder per `dest` at a time: a build clears staging folders it finds there, taking them for leftovers of a
    killed build."""
    dest = Path(dest)
    names = demo_names() if names is None else names
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        if demo_target(dest, name).exists():
            raise FileExistsError(f"{demo_target(dest, name)} already exists")
    _remove_stale_builds(dest)
    # The build folder sits in dest so the final renames stay on one filesystem (atomic).
    staging = Path(tempfile.mkdtemp(prefix=_BUILD_PREFIX, dir=dest))
    built = []
    try:
        for name in names:
            _build_one(name, staging)
        for name in names:
            final = demo_target(dest, name)
            os.replace(demo_target(staging, name), final)
            family, demo = _known(name)
            built.append(BuiltDemo(name, family.name, demo.type, demo.format, demo.description, final))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return built


def _build_one(name: str, into: Path) -> Path:
    """Build demo model `name` under `into`; returns its path there."""
    target = demo_target(into, name)
    _known(name)[1].build(target)
    return target


def _remove_stale_builds(dest: Path) -> None:
    """Staging folders left by a build that was killed: never a model, safe to drop."""
    for leftover in dest.glob(f"{_BUILD_PREFIX}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
