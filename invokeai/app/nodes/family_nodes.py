"""What the families' nodes have in common, written once: the VAE decode and encode nodes, the inputs every denoise
node has, and the size inputs with the family's multiple.

A family's node module subclasses these templates and declares only what is its own: the `type`, the docstring,
the family (`family`, its descriptor), where its tensors are kept (`latents_kind`) and the module of its generation
code (`generation`, imported when a node runs, since it imports diffusers). A template itself is no node: it sets
`__node_template__`, which the node registry reads from the class's own namespace only, so subclasses register.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, ClassVar

from invokeai.app.nodes.base import BaseInvocation, ImageField, InputField, InvocationContext
from invokeai.app.nodes.image import MAX_DIMENSION, ImageOutput
from invokeai.app.nodes.model_fields import SEED_MAX, LatentsField, LatentsOutput, ModelIdentifier, ModelInputField
from invokeai.app.nodes.model_use import TensorKind, decode_latents, encode_image, family_model, provider
from invokeai.backend.families import Family

MODEL_DESCRIPTION = "The model (a lone transformer gets this component from the pipeline of its family paired with it)"


def size_input(family: Family, side: str, default: int) -> Any:
    """A width or height input: at least the family's size multiple and a multiple of it (what its denoiser and
    VAE take), at most the server's largest side."""
    multiple = family.constants.size_multiple
    return InputField(
        default=default,
        ge=multiple,
        le=MAX_DIMENSION,
        multiple_of=multiple,
        description=f"The {side}, a multiple of {multiple}",
    )


class FamilyNode(BaseInvocation):
    """A node of one model family."""

    __node_template__ = True

    family: ClassVar[Family]
    latents_kind: ClassVar[TensorKind]
    generation: ClassVar[str]

    @classmethod
    def backend(cls) -> ModuleType:
        return importlib.import_module(cls.generation)

    def invoke(self, context: InvocationContext) -> Any:  # a template is never run; subclasses define invoke
        raise NotImplementedError


def latents_kinds_decoded_by(node_type: str) -> list[TensorKind]:
    """The latents kinds of every family whose graphs decode with `node_type` (a decode node one family owns and
    another's graphs use too, as InvokeAI's Krea-2 graphs decode with its Qwen-Image node), from the registered
    family nodes: each family keeps its latents as its nodes' `latents_kind`."""
    from invokeai.app.nodes.base import invocation_classes

    kinds: list[TensorKind] = []
    for cls in invocation_classes():
        if issubclass(cls, FamilyNode) and cls.family.graph.decode == node_type and cls.latents_kind not in kinds:
            kinds.append(cls.latents_kind)
    return kinds


class DenoiseInputs(FamilyNode):
    """The inputs every denoise node has besides its conditioning, size, steps and guidance: the model and the
    seed."""

    __node_template__ = True

    model: ModelIdentifier = ModelInputField(description="The model, or a transformer file of its family")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the noise")


class ImageToImageInputs(DenoiseInputs):
    """A denoise node's inputs with image-to-image: also the latents to start from and how much of the schedule
    they run."""

    __node_template__ = True

    latents: LatentsField | None = InputField(
        default=None,
        description="Latents to start from (the family's encode node), for image-to-image; their size must match",
    )
    denoising_strength: float = InputField(
        default=1.0, ge=0.0, le=1.0, description="With latents: how much of the schedule to run (1: all of it)"
    )


class VaeDecodeNode(FamilyNode):
    """Template: the image the model's VAE decodes from latents."""

    __node_template__ = True

    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    latents: LatentsField = InputField(description="The latents to decode (the family's denoise node)")

    def invoke(self, context: InvocationContext) -> ImageOutput:
        source = provider(context, family_model(context, self.model, self.family.name), "vae")
        return decode_latents(context, source, self.latents_kind, self.latents.latents_name, self.backend().vae_decode)


class VaeEncodeNode(FamilyNode):
    """Template: latents of an image, sampled from the model's VAE posterior with the seed, for image-to-image."""

    __node_template__ = True

    model: ModelIdentifier = ModelInputField(description=MODEL_DESCRIPTION)
    image: ImageField = InputField(description="The image; its sides must be multiples of the family's size multiple")
    seed: int = InputField(default=0, ge=0, le=SEED_MAX, description="The seed of the posterior sample")

    def invoke(self, context: InvocationContext) -> LatentsOutput:
        source = provider(context, family_model(context, self.model, self.family.name), "vae")
        return encode_image(context, source, self.latents_kind, self.image, self.seed, self.backend().vae_encode)
