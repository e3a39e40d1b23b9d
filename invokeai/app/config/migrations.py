"""invokeai.yaml schema versions and the steps that carry an older file's values forward.

A step takes the values of version N and returns those of version N + 1 plus notes for the log. Adding a
schema version: bump CURRENT_SCHEMA_VERSION and register the step from the previous one in STEPS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CURRENT_SCHEMA_VERSION = 2

Values = dict[str, Any]


class MigrationError(ValueError):
    """A value of an older schema has no counterpart; the message names the key and what it may be."""


# Schema 1 named the setting attention_type and took InvokeAI 3/4's values. xformers' kernel lives on in
# PyTorch as the memory-efficient kernel. normal and sliced were workarounds from before fused kernels; pinning
# math instead would be slow and memory-hungry, so they become auto like torch-sdp.
_V1_ATTENTION_TYPES = {"auto": "auto", "torch-sdp": "auto", "normal": "auto", "sliced": "auto", "xformers": "efficient"}


def _v1_to_v2(values: Values) -> tuple[Values, list[str]]:
    """`attention_type` became `attention_backend`: `xformers` becomes `efficient` (PyTorch's memory-efficient
    kernel descends from xformers'); `auto`, `torch-sdp`, `normal` and `sliced` become `auto` (set `math` by hand
    to debug with the plain kernel). `attention_slice_size` was removed: PyTorch's kernels tile on their own.
    """
    values = dict(values)
    notes = []
    if "attention_type" in values:
        old = values.pop("attention_type")
        if old not in _V1_ATTENTION_TYPES:
            allowed = ", ".join(_V1_ATTENTION_TYPES)
            raise MigrationError(f"'attention_type' is {old!r}; allowed in schema_version 1: {allowed}")
        values["attention_backend"] = _V1_ATTENTION_TYPES[old]
        notes.append(f"attention_type {old!r} became attention_backend {values['attention_backend']!r}")
    if "attention_slice_size" in values:
        values.pop("attention_slice_size")
        notes.append("attention_slice_size was removed (no longer used)")
    return values, notes


STEPS: dict[int, Callable[[Values], tuple[Values, list[str]]]] = {1: _v1_to_v2}


def migrate(values: Values, version: int) -> tuple[Values, list[str]]:
    """Values of schema `version` carried to CURRENT_SCHEMA_VERSION, with notes on what changed."""
    notes: list[str] = []
    while version < CURRENT_SCHEMA_VERSION:
        values, step_notes = STEPS[version](values)
        notes.extend(step_notes)
        version += 1
    return values, notes
