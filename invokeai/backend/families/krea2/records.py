"""How InvokeAI's records describe a Krea-2 model: Turbo (distilled) or Base (Krea-2-Raw), and their defaults."""

from __future__ import annotations

import re
from pathlib import Path

from invokeai.backend.families.family import ModelOnDisk, RecordFacts

_DEFAULTS = {
    "krea2_base": {"steps": 28, "cfg_scale": 5.5, "width": 1024, "height": 1024},
    "krea2_turbo": {"steps": 8, "cfg_scale": 1.0, "width": 1024, "height": 1024},
}


def _variant_of_name(name: str) -> str:
    """Turbo and Raw share one transformer architecture, so a single file tells them apart only by its name: a
    "turbo" anywhere means Turbo, a whole "raw" or "base" token means Base, anything else Turbo (as InvokeAI
    guesses)."""
    lowered = Path(name).stem.lower()
    if "turbo" in lowered:
        return "krea2_turbo"
    tokens = set(re.split(r"[^a-z0-9]+", lowered))
    return "krea2_base" if tokens & {"raw", "base"} else "krea2_turbo"


def describe(model: ModelOnDisk) -> RecordFacts:
    if model.single_file:
        variant = _variant_of_name(model.name)
    else:
        # The pipeline says so itself: model_index.json's is_distilled (false or absent: the undistilled Base).
        variant = "krea2_turbo" if model.read("model_index").get("is_distilled", False) is True else "krea2_base"
    return RecordFacts(variant=variant, default_settings=_DEFAULTS[variant])
