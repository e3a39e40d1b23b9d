"""What every generation node does with models and tensors: resolve a model of the right family, find the model
that provides a component, decode stored latents, and store or read tagged tensors. Working memory is the model
manager's business: a node asks `context.models.on_device(record, operation, **facts)` once per call."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from invokeai.app.nodes.image import BoardField, ImageOutput
from invokeai.app.nodes.model_fields import LatentsField, LatentsOutput, MetadataField

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from invokeai.app.nodes.context import InvocationContext
    from invokeai.app.nodes.fields import ImageField
    from invokeai.app.services.model_records import ModelIdentifier, ModelRecord
    from invokeai.backend.families.family import Family
    from invokeai.backend.generation.preview import RgbProjection


def family_model(context: InvocationContext, ident: ModelIdentifier, family: str) -> ModelRecord:
    """The record `ident` names; a model of another family is refused here, before anything is loaded, with a
    message that names both families rather than a shape error from deep inside a forward pass."""
    record = context.models.resolve(ident)
    if record.family != family:
        raise ValueError(
            f"model {record.name!r} is of the {record.family} family; {context.node_type} needs a model of the "
            f"{family} family"
        )
    return record


def provider(context: InvocationContext, record: ModelRecord, component: str) -> ModelRecord:
    """The record that provides `component`: the model itself, or, for a lone transformer (a GGUF file), the
    installed pipeline of its family the manager pairs it with."""
    if component in context.models.components(record):
        return record
    return context.models.companion(record, component)


def part_handle(record: ModelRecord, part: str) -> ModelIdentifier:
    """The handle on one part of an installed model, as InvokeAI's loaders write it (submodel_type: the part)."""
    from invokeai.app.services.model_records import ModelIdentifier

    return ModelIdentifier(key=record.key, name=record.name, hash=record.hash, type=record.type, submodel_type=part)


def loaded_transformer_model(
    context: InvocationContext, ident: ModelIdentifier, family: Family, hint: str
) -> ModelRecord:
    """The model a family's loader node is given: of the family and with a transformer. A model without one (a
    lone VAE or text encoder file) is refused here rather than paired with a pipeline's; `hint` says where such a
    part goes instead."""
    record = family_model(context, ident, family.name)
    if "transformer" not in context.models.components(record):
        raise ValueError(
            f"model {record.name!r} is a {family.title} {record.type} without a transformer; name a {family.title} "
            f"pipeline or transformer file as the model{f' ({hint})' if hint else ''}"
        )
    return record


def loader_part(
    context: InvocationContext, ident: ModelIdentifier, field: str, component: str, what: str, family: Family
) -> ModelRecord:
    """The record providing `component` for a model named in a loader's `field`: a model of the family that has
    it, or the pipeline a lone transformer of the family is paired with."""
    record = context.models.resolve(ident)
    if record.family != family.name:
        raise ValueError(
            f"{field}: model {record.name!r} is of the {record.family} family; {what} comes from {family.title}"
        )
    return provider(context, record, component)


def loader_vae(
    context: InvocationContext, ident: ModelIdentifier | None, source: ModelRecord, family: Family
) -> ModelRecord:
    """The VAE a loader's `vae_model` names (any family's, if its latents have the family's channels), else
    `source`'s own or its paired pipeline's."""
    channels = family.constants.latent_channels
    vae = context.models.resolve(ident) if ident else provider(context, source, "vae")
    if "vae" not in context.models.components(vae):
        raise ValueError(f"vae_model: model {vae.name!r} has no VAE")
    found = context.models.config(vae, "vae").get("latent_channels")
    if found != channels:
        raise ValueError(
            f"vae_model: model {vae.name!r} has a VAE of {found} latent channels; {family.title}'s has {channels}"
        )
    return vae


def fitted_preview(
    context: InvocationContext,
    record: ModelRecord,
    known: Callable[[Any], RgbProjection | None],
    fit: Callable[[Any], RgbProjection],
) -> RgbProjection | None:
    """The step-preview map of the VAE that will decode `record`'s latents: `known(vae)` where the VAE has a known
    one, else `fit(vae)` on the execution device with the fit's working memory reserved. None (no previews) when it
    cannot be had, since a preview is never worth failing a generation for; the missing VAE itself is reported by
    the family's decode node."""
    from invokeai.backend.families import get_family
    from invokeai.backend.generation.preview import FIT_COLOURS, FIT_SIZE

    try:
        source = provider(context, record, "vae")
        projection = known(context.models.load(source, "vae"))
        if projection is not None:
            return projection
        # The fit encodes. A family without an encode estimator (none of its nodes encodes) is priced by its decode,
        # the heavier half of the VAE, whose estimate at the fit's size and batch bounds the encoder's.
        operation = "vae_encode" if "vae_encode" in get_family(source.family).operations else "vae_decode"
        with context.models.on_device(source, operation, width=FIT_SIZE, height=FIT_SIZE, batch=FIT_COLOURS) as vae:
            return fit(vae)
    except Exception as error:
        logger.warning("%s: no step previews for model %r: %s", context.node_type, record.name, error)
        return None


def step_reporter(context: InvocationContext, projection: RgbProjection | None) -> Callable[[int, int, Any], None]:
    """A denoise loop's `on_step`: reports each step with a preview of the latents through `projection` (none
    without one). Reporting is also the cancel check, so a canceled item stops there, mid-denoise."""
    from invokeai.backend.generation.preview import rgb_preview

    def on_step(step: int, total: int, latents: torch.Tensor) -> None:
        context.progress(step, total, None if projection is None else partial(rgb_preview, latents, projection))

    return on_step


@dataclass(frozen=True)
class TensorKind:
    """One kind of tensors that nodes store: the keys they are saved under (unique to the kind, so a name of the
    wrong kind is recognised), and the node types that make them, for the error message."""

    what: str
    keys: tuple[str, ...]
    made_by: str

    def save(self, context: InvocationContext, *tensors: torch.Tensor) -> str:
        return context.tensors.save(dict(zip(self.keys, tensors, strict=True)), owner=context.session_id)

    def holds(self, context: InvocationContext, name: str) -> bool:
        """Whether the stored tensors `name` are of this kind (a node that takes several kinds picks with it)."""
        stored = context.tensors.load(name)
        return isinstance(stored, dict) and set(stored) == set(self.keys)

    def load(self, context: InvocationContext, name: str) -> tuple[torch.Tensor, ...]:
        stored = context.tensors.load(name)
        if not isinstance(stored, dict) or set(stored) != set(self.keys):
            raise ValueError(f"{self.what} {name!r} was not made by {self.made_by}, which {context.node_type} needs")
        return tuple(stored[key] for key in self.keys)


def latents_output(
    context: InvocationContext, kind: TensorKind, latents: torch.Tensor, width: int, height: int
) -> LatentsOutput:
    """A node's output of `latents` (of a width x height image), stored as `kind`."""
    return LatentsOutput(latents=LatentsField(latents_name=kind.save(context, latents)), width=width, height=height)


def start_latents(
    context: InvocationContext, record: ModelRecord, kind: TensorKind, latents_name: str, width: int, height: int
) -> torch.Tensor:
    """Stored latents to start an image-to-image denoise from; refused unless they are of a width x height image
    (as `record`'s family spans pixels per latent), since the denoiser would otherwise fail on shapes or crop."""
    from invokeai.backend.families import get_family

    (latents,) = kind.load(context, latents_name)
    scale = get_family(record.family).constants.latent_scale
    latent_height, latent_width = (side * scale for side in latents.shape[-2:])
    if (latent_width, latent_height) != (width, height):
        raise ValueError(
            f"the latents are of a {latent_width}x{latent_height} image but width x height is {width}x{height}; "
            "set width and height to the image's size"
        )
    return latents


def encode_image(
    context: InvocationContext,
    record: ModelRecord,
    kind: TensorKind,
    image_field: ImageField,
    seed: int,
    vae_encode: Callable[[Any, Image.Image, int], torch.Tensor],
) -> LatentsOutput:
    """The latents `vae_encode` samples from the image with `record`'s VAE and the seed, stored as `kind`, with the
    working memory for an encode of that size reserved. The image's sides must be multiples of the family's size
    multiple (what its denoiser takes)."""
    from invokeai.backend.families import get_family

    multiple = get_family(record.family).constants.size_multiple
    image = context.load_image(image_field).convert("RGB")
    if image.width % multiple or image.height % multiple:
        raise ValueError(
            f"image {image_field.image_name} is {image.width}x{image.height}; {context.node_type} needs sides that "
            f"are multiples of {multiple} (resize it first with image_resize)"
        )
    with context.models.on_device(record, "vae_encode", width=image.width, height=image.height) as vae:
        latents = vae_encode(vae, image, seed)
    return latents_output(context, kind, latents, image.width, image.height)


def decode_latents(
    context: InvocationContext,
    record: ModelRecord,
    kind: TensorKind,
    latents_name: str,
    vae_decode: Callable[[Any, torch.Tensor], Image.Image],
    *,
    metadata: MetadataField | None = None,
    board: BoardField | None = None,
) -> ImageOutput:
    """The image `vae_decode` makes from the stored latents with `record`'s VAE, saved (with InvokeAI's metadata
    and board inputs, where the node has them), with the working memory for a decode of that size reserved."""
    from invokeai.backend.families import get_family

    (latents,) = kind.load(context, latents_name)
    latent_scale = get_family(record.family).constants.latent_scale
    height, width = (side * latent_scale for side in latents.shape[-2:])
    with context.models.on_device(record, "vae_decode", width=width, height=height) as vae:
        image = vae_decode(vae, latents)
    return ImageOutput.saved(context, image, metadata=metadata, board=board)
