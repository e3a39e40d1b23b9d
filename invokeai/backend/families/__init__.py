"""Model families: one folder per family (its descriptor, configs, generation, estimators, runs, demo builder)
and the registry that the generic code (probe, loaders, records, demo install, estimators, nodes) iterates.

The registry's names are read from `registry` when first asked for (PEP 562), not when the package is imported: a
family's own modules import `families.family` (and so this package) while the registry imports every family's
descriptor, so an eager import here would make each family import the registry, and the others, back.
"""

from importlib import import_module
from typing import Any

from invokeai.backend.families.family import (
    Constants,
    DemoModel,
    Family,
    FileRule,
    GraphFacts,
    InvokeAIFacts,
    ModelOnDisk,
    RecordFacts,
)

_REGISTRY_NAMES = frozenset(
    {"FAMILIES", "config_variant", "family_for_pipeline", "family_names", "get_family", "pipeline_classes"}
)

__all__ = [
    "FAMILIES",
    "Constants",
    "DemoModel",
    "Family",
    "FileRule",
    "GraphFacts",
    "InvokeAIFacts",
    "ModelOnDisk",
    "RecordFacts",
    "config_variant",
    "family_for_pipeline",
    "family_names",
    "get_family",
    "pipeline_classes",
]


def __getattr__(name: str) -> Any:
    if name in _REGISTRY_NAMES:
        return getattr(import_module("invokeai.backend.families.registry"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
