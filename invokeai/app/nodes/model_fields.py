"""What generation nodes pass along edges (conditioning, latents) and how their inputs name a model.

Tensors do not travel in the graph: a node stores them in the context's tensor store and passes their name, so a
queue item's results stay small JSON and a tensor is read only by the node that uses it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, RootModel

from invokeai.app.nodes.base import BaseInvocationOutput, InputField, OutputField
from invokeai.app.services.model_records import ModelIdentifier

__all__ = [
    "SEED_MAX",
    "CLIPField",
    "ConditioningField",
    "ConditioningOutput",
    "LatentsField",
    "LatentsOutput",
    "MetadataField",
    "ModelIdentifier",
    "ModelInputField",
    "NoLoras",
    "NoMask",
    "Qwen3EncoderField",
    "T5EncoderField",
    "TensorField",
    "TransformerField",
    "UNetField",
    "VAEField",
]

SEED_MAX = 2**32 - 1  # InvokeAI's seed range, so seeds carry over from its clients


class TensorField(BaseModel):
    """InvokeAI's handle on a tensor in the tensor store (a regional prompt's mask, among others)."""

    model_config = ConfigDict(extra="forbid")

    tensor_name: str = Field(description="The name of the tensor")


def _no_mask(value: TensorField | None) -> TensorField | None:
    if value is not None:
        raise ValueError("regional prompt masks are not supported by this server yet; send null")
    return value


NoMask = Annotated[TensorField | None, AfterValidator(_no_mask)]


class ConditioningField(BaseModel):
    """Prompt conditioning made by a text-encoder node, held in the tensor store. InvokeAI's `mask` (the region a
    prompt applies to) is accepted only as null: this server has no regional prompting yet."""

    model_config = ConfigDict(extra="forbid")

    conditioning_name: str = Field(description="The name of the conditioning tensors in the tensor store")
    mask: NoMask = Field(default=None, description="InvokeAI's regional mask; this server takes none yet (null)")


class LatentsField(BaseModel):
    """Latents made by a denoise or VAE-encode node (or noise by `noise`), held in the tensor store. `seed`, as in
    InvokeAI: the seed the noise was drawn with, which denoise_latents seeds its sampler from."""

    model_config = ConfigDict(extra="forbid")

    latents_name: str = Field(description="The name of the latents tensor in the tensor store")
    seed: int | None = Field(default=None, description="The seed the latents (noise) were made with, if any")


def _none_yet(what: str) -> Any:
    """A list InvokeAI's handles carry that this server does not act on yet: accepted empty, refused otherwise with
    what is missing (rather than run without what the client asked for)."""

    def check(items: list[Any]) -> list[Any]:
        if items:
            raise ValueError(f"{what} are not supported by this server yet; send an empty list")
        return items

    return AfterValidator(check)


NoLoras = Annotated[list[dict[str, Any]], _none_yet("LoRAs"), Field(json_schema_extra={"maxItems": 0})]
NoSeamless = Annotated[list[str], _none_yet("seamless tiling axes"), Field(json_schema_extra={"maxItems": 0})]


def _no_freeu(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None:
        raise ValueError("FreeU is not supported by this server yet; send null")
    return value


NoFreeU = Annotated[dict[str, Any] | None, AfterValidator(_no_freeu)]


class TransformerField(BaseModel):
    """InvokeAI's handle on a model's transformer, as its model-loader nodes pass it to a denoise node: the model
    that provides the component (a pipeline, or a lone transformer file)."""

    model_config = ConfigDict(extra="forbid")

    transformer: ModelIdentifier = Field(description="The model whose transformer this is")
    loras: NoLoras = Field(default_factory=list, description="InvokeAI's LoRAs; this server takes none yet (empty)")


class UNetField(BaseModel):
    """InvokeAI's handle on a model's UNet and its scheduler, as main_model_loader and sdxl_model_loader pass it to
    denoise_latents."""

    model_config = ConfigDict(extra="forbid")

    unet: ModelIdentifier = Field(description="The model whose UNet this is")
    scheduler: ModelIdentifier = Field(description="The model whose scheduler config this is")
    loras: NoLoras = Field(default_factory=list, description="InvokeAI's LoRAs; this server takes none yet (empty)")
    seamless_axes: NoSeamless = Field(
        default_factory=list, description="InvokeAI's seamless tiling axes; this server tiles none yet"
    )
    freeu_config: NoFreeU = Field(default=None, description="InvokeAI's FreeU settings; this server has none yet")


class CLIPField(BaseModel):
    """InvokeAI's handle on a CLIP text encoder and its tokenizer, with how many of its last layers to skip."""

    model_config = ConfigDict(extra="forbid")

    tokenizer: ModelIdentifier = Field(description="The model whose tokenizer this is")
    text_encoder: ModelIdentifier = Field(description="The model whose CLIP text encoder this is")
    skipped_layers: int = Field(ge=0, le=100, description="How many of the encoder's last layers to skip")
    loras: NoLoras = Field(default_factory=list, description="InvokeAI's LoRAs; this server takes none yet (empty)")


class T5EncoderField(BaseModel):
    """InvokeAI's handle on a T5 text encoder and its tokenizer."""

    model_config = ConfigDict(extra="forbid")

    tokenizer: ModelIdentifier = Field(description="The model whose tokenizer this is")
    text_encoder: ModelIdentifier = Field(description="The model whose T5 text encoder this is")
    loras: NoLoras = Field(default_factory=list, description="InvokeAI's LoRAs; this server takes none yet (empty)")


class Qwen3EncoderField(BaseModel):
    """InvokeAI's handle on a Qwen3 text encoder and its tokenizer (Z-Image's and Anima's loaders pass it)."""

    model_config = ConfigDict(extra="forbid")

    tokenizer: ModelIdentifier = Field(description="The model whose tokenizer this is")
    text_encoder: ModelIdentifier = Field(description="The model whose Qwen3 text encoder this is")
    loras: NoLoras = Field(default_factory=list, description="InvokeAI's LoRAs; this server takes none yet (empty)")


class MetadataField(RootModel[dict[str, JsonValue]]):
    """InvokeAI's free-form metadata (core_metadata's output): written into an image's invokeai_metadata chunk."""

    root: dict[str, JsonValue] = Field(description="The metadata")


class VAEField(BaseModel):
    """InvokeAI's handle on a VAE, as its model-loader nodes pass it to the decode and encode nodes."""

    model_config = ConfigDict(extra="forbid")

    vae: ModelIdentifier = Field(description="The model whose VAE this is")
    seamless_axes: NoSeamless = Field(
        default_factory=list, description="InvokeAI's seamless tiling axes; this server tiles none yet"
    )


class ConditioningOutput(BaseInvocationOutput):
    type: Literal["conditioning_output"] = "conditioning_output"
    conditioning: ConditioningField = OutputField(description="The conditioning")


class LatentsOutput(BaseInvocationOutput):
    type: Literal["latents_output"] = "latents_output"
    latents: LatentsField = OutputField(description="The latents")
    width: int = OutputField(description="The width in pixels of the image the latents decode to")
    height: int = OutputField(description="The height in pixels of the image the latents decode to")


def ModelInputField(*, description: str) -> Any:  # named like InputField, which it wraps
    """A required model input; the value is an installed model's record key or name."""
    return InputField(description=f'{description}; {{"key": "..."}} or {{"name": "..."}} of an installed model')
