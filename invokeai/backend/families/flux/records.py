"""How InvokeAI's records describe a FLUX.1 model: dev, schnell or dev_fill, from the transformer's config."""

from __future__ import annotations

from invokeai.backend.families.family import ModelOnDisk, RecordFacts


def describe(model: ModelOnDisk) -> RecordFacts:
    # A lone VAE has no variant in InvokeAI's records; a transformer (alone or in a pipeline) has one.
    if model.type == "vae":
        return RecordFacts()
    transformer = model.read("transformer")
    guided = bool(transformer.get("guidance_embeds", False))
    # Fill's transformer also takes the masked image and the mask: 384 input channels instead of 64.
    if guided and transformer.get("in_channels") == 384:
        return RecordFacts(variant="dev_fill")
    return RecordFacts(variant="dev" if guided else "schnell")
