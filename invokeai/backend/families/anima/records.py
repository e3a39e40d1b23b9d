"""How InvokeAI's records describe an Anima model: no variant (InvokeAI records none for Anima), and the
recommended steps, CFG and size."""

from __future__ import annotations

from invokeai.backend.families.anima.constants import GUIDANCE_SCALE, RECOMMENDED_STEPS, SIDE
from invokeai.backend.families.family import ModelOnDisk, RecordFacts

DEFAULTS = {"steps": RECOMMENDED_STEPS, "cfg_scale": GUIDANCE_SCALE, "width": SIDE, "height": SIDE}


def describe(model: ModelOnDisk) -> RecordFacts:
    if model.type not in ("main", "transformer"):
        return RecordFacts()  # a lone text encoder or VAE: no defaults to recommend
    return RecordFacts(default_settings=DEFAULTS)
