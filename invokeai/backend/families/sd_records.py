"""How InvokeAI's records describe a Stable Diffusion model (SD-1, SDXL): its variant from the UNet's input
channels, its prediction type from the scheduler, and the image size it defaults to."""

from __future__ import annotations

from collections.abc import Callable

from invokeai.backend.families.family import ModelOnDisk, RecordFacts

# The UNet's input channels: latents alone, or with a depth map (SD-2 only), or with a mask and masked image.
_VARIANTS = {4: "normal", 5: "depth", 9: "inpaint"}


def sd_describer(size: int) -> Callable[[ModelOnDisk], RecordFacts]:
    """A `describe` for an SD family whose models default to `size` x `size` pixels."""

    def describe(model: ModelOnDisk) -> RecordFacts:
        if model.type != "main":
            return RecordFacts()
        in_channels = model.read("unet").get("in_channels", 4)
        prediction_type = model.read("scheduler").get("prediction_type", "epsilon")
        return RecordFacts(
            variant=_VARIANTS.get(in_channels) if isinstance(in_channels, int) else None,
            prediction_type=prediction_type if prediction_type in ("epsilon", "v_prediction", "sample") else None,
            default_settings={"width": size, "height": size},
        )

    return describe
