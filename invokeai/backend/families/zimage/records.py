"""How InvokeAI's records describe a Z-Image model: Turbo (distilled) or Base, and the steps and CFG each takes."""

from __future__ import annotations

from invokeai.backend.families.family import ModelOnDisk, RecordFacts

# The undistilled base model's scheduler shifts the schedule by 6, Turbo's by 3; InvokeAI splits them at 5.
_BASE_SHIFT = 5.0
_DEFAULTS = {
    "zbase": {"steps": 50, "cfg_scale": 4.0, "width": 1024, "height": 1024},
    "turbo": {"steps": 9, "cfg_scale": 1.0, "width": 1024, "height": 1024},
}


def describe(model: ModelOnDisk) -> RecordFacts:
    if model.type != "main" and model.type != "transformer":
        return RecordFacts()  # the Qwen3 text encoder alone: InvokeAI's variant there is the encoder's size
    if model.single_file:
        # A single transformer file carries no scheduler: InvokeAI records it as Turbo unless told otherwise.
        variant = "turbo"
    else:
        shift = model.read("scheduler").get("shift", 3.0)
        variant = "zbase" if isinstance(shift, int | float) and shift >= _BASE_SHIFT else "turbo"
    return RecordFacts(variant=variant, default_settings=_DEFAULTS[variant])
