"""Model families: one folder per family (its descriptor, configs, generation, estimators, runs, demo builder)
and the registry that the generic code (probe, loaders, records, demo install, estimators, nodes) iterates."""

from invokeai.backend.families.family import Constants, DemoModel, Family, FileRule, GraphFacts
from invokeai.backend.families.registry import (
    FAMILIES,
    config_variant,
    family_for_pipeline,
    family_names,
    get_family,
    pipeline_classes,
)

__all__ = [
    "FAMILIES",
    "Constants",
    "DemoModel",
    "Family",
    "FileRule",
    "GraphFacts",
    "config_variant",
    "family_for_pipeline",
    "family_names",
    "get_family",
    "pipeline_classes",
]
