"""How InvokeAI's records describe a Qwen-Image model: the `generate` variant (text-to-image and image-to-image; the
Edit models are InvokeAI's `edit`), and the pipeline's recommended steps, CFG and size."""

from __future__ import annotations

from invokeai.backend.families.family import ModelOnDisk, RecordFacts
from invokeai.backend.families.qwen_image.constants import (
    EDIT_PIPELINE,
    EDIT_PLUS_PIPELINE,
    SIDE,
    STEPS,
    TRUE_CFG_SCALE,
)

DEFAULTS = {"steps": STEPS, "cfg_scale": TRUE_CFG_SCALE, "width": SIDE, "height": SIDE}


def describe(model: ModelOnDisk) -> RecordFacts:
    if model.type not in ("main", "transformer"):
        return RecordFacts()  # a lone text encoder or VAE: InvokeAI records no variant for them
    pipeline = model.read("model_index").get("_class_name")
    variant = "edit" if pipeline in (EDIT_PIPELINE, EDIT_PLUS_PIPELINE) else "generate"
    return RecordFacts(variant=variant, default_settings=DEFAULTS)
