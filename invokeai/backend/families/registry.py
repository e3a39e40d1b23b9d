"""FAMILIES, the one list of model families the server runs, and lookups over it. Adding a family is adding its
folder and one line here."""

from __future__ import annotations

from invokeai.backend.families.anima.descriptor import FAMILY as ANIMA
from invokeai.backend.families.family import Family
from invokeai.backend.families.flux.descriptor import FAMILY as FLUX
from invokeai.backend.families.krea2.descriptor import FAMILY as KREA2
from invokeai.backend.families.qwen_image.descriptor import FAMILY as QWEN_IMAGE
from invokeai.backend.families.sd1.descriptor import FAMILY as SD1
from invokeai.backend.families.sdxl.descriptor import FAMILY as SDXL
from invokeai.backend.families.zimage.descriptor import FAMILY as ZIMAGE
from invokeai.backend.models.config_variants import ConfigVariant

FAMILIES: tuple[Family, ...] = (SD1, KREA2, FLUX, SDXL, ZIMAGE, QWEN_IMAGE, ANIMA)


def family_names() -> tuple[str, ...]:
    return tuple(family.name for family in FAMILIES)


def get_family(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise KeyError(f"no model family {name!r}; known: {', '.join(family_names())}")


def family_for_pipeline(class_name: str) -> Family | None:
    """The family whose diffusers pipeline class (model_index.json's `_class_name`) this is."""
    for family in FAMILIES:
        if class_name in family.pipeline_classes:
            return family
    return None


def pipeline_classes() -> tuple[str, ...]:
    return tuple(name for family in FAMILIES for name in family.pipeline_classes)


def config_variant(name: str) -> ConfigVariant:
    """A shipped config folder by its name (unique across families; records store it)."""
    for family in FAMILIES:
        for variant in family.config_variants:
            if variant.name == name:
                return variant
    known = ", ".join(variant.name for family in FAMILIES for variant in family.config_variants)
    raise KeyError(f"no shipped config variant {name!r}; known: {known}")
