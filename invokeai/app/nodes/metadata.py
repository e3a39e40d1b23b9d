"""InvokeAI's `core_metadata` node: the generation's settings, which an image node writes into its PNG as the
`invokeai_metadata` chunk (the node's `metadata` input). Every field is optional, and fields InvokeAI's frontend adds
beyond these (its canvas settings, say) are kept as they are sent."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, JsonValue

from invokeai.app.nodes.base import NODE_FIELDS, BaseInvocation, BaseInvocationOutput, InputField, OutputField
from invokeai.app.nodes.context import InvocationContext
from invokeai.app.nodes.model_fields import MetadataField, ModelIdentifier
from invokeai.app.version import app_version

# InvokeAI 6.14.2's generation modes, as its frontend labels an image.
GenerationMode = Literal[
    "txt2img",
    "img2img",
    "inpaint",
    "outpaint",
    "sdxl_txt2img",
    "sdxl_img2img",
    "sdxl_inpaint",
    "sdxl_outpaint",
    "flux_txt2img",
    "flux_img2img",
    "flux_inpaint",
    "flux_outpaint",
    "flux2_txt2img",
    "flux2_img2img",
    "flux2_inpaint",
    "flux2_outpaint",
    "sd3_txt2img",
    "sd3_img2img",
    "sd3_inpaint",
    "sd3_outpaint",
    "cogview4_txt2img",
    "cogview4_img2img",
    "cogview4_inpaint",
    "cogview4_outpaint",
    "z_image_txt2img",
    "z_image_img2img",
    "z_image_inpaint",
    "z_image_outpaint",
    "ernie_image_txt2img",
    "ideogram4_txt2img",
    "qwen_image_txt2img",
    "qwen_image_img2img",
    "qwen_image_inpaint",
    "qwen_image_outpaint",
    "anima_txt2img",
    "anima_img2img",
    "anima_inpaint",
    "anima_outpaint",
    "krea2_txt2img",
    "krea2_img2img",
    "krea2_inpaint",
    "krea2_outpaint",
    "wan_txt2img",
    "wan_img2img",
    "wan_inpaint",
    "wan_outpaint",
    "wan_i2v",
]


class MetadataOutput(BaseInvocationOutput):
    type: Literal["metadata_output"] = "metadata_output"
    metadata: MetadataField = OutputField(description="Metadata Dict")


class CoreMetadataInvocation(BaseInvocation):
    """Collects the generation's settings for an image's metadata (InvokeAI's frontend adds one to every graph)."""

    # InvokeAI's node takes fields beyond its own (the frontend's canvas and reference-image settings): kept as sent.
    model_config = ConfigDict(extra="allow")

    type: Literal["core_metadata"] = "core_metadata"
    generation_mode: GenerationMode | None = InputField(
        default=None, description="The generation mode that output this image"
    )
    positive_prompt: str | None = InputField(default=None, description="The positive prompt parameter")
    negative_prompt: str | None = InputField(default=None, description="The negative prompt parameter")
    width: int | None = InputField(default=None, description="The width parameter")
    height: int | None = InputField(default=None, description="The height parameter")
    seed: int | None = InputField(default=None, description="The seed used for noise generation")
    rand_device: str | None = InputField(default=None, description="The device used for random number generation")
    cfg_scale: float | None = InputField(default=None, description="The classifier-free guidance scale parameter")
    cfg_rescale_multiplier: float | None = InputField(
        default=None, description="Rescale multiplier for CFG guidance, used for models trained with zero-terminal SNR"
    )
    steps: int | None = InputField(default=None, description="The number of steps used for inference")
    scheduler: str | None = InputField(default=None, description="The scheduler used for inference")
    seamless_x: bool | None = InputField(default=None, description="Whether seamless tiling was used on the X axis")
    seamless_y: bool | None = InputField(default=None, description="Whether seamless tiling was used on the Y axis")
    clip_skip: int | None = InputField(default=None, description="The number of skipped CLIP layers")
    model: ModelIdentifier | None = InputField(default=None, description="The main model used for inference")
    controlnets: list[dict[str, JsonValue]] | None = InputField(
        default=None, description="The ControlNets used for inference"
    )
    ipAdapters: list[dict[str, JsonValue]] | None = InputField(
        default=None, description="The IP Adapters used for inference"
    )
    t2iAdapters: list[dict[str, JsonValue]] | None = InputField(
        default=None, description="The IP Adapters used for inference"
    )
    loras: list[dict[str, JsonValue]] | None = InputField(default=None, description="The LoRAs used for inference")
    strength: float | None = InputField(default=None, description="The strength used for latents-to-latents")
    init_image: str | None = InputField(default=None, description="The name of the initial image")
    vae: ModelIdentifier | None = InputField(
        default=None, description="The VAE used for decoding, if the main model's default was not used"
    )
    qwen3_encoder: ModelIdentifier | None = InputField(
        default=None, description="The Qwen3 text encoder model used for Z-Image inference"
    )
    mistral_encoder: ModelIdentifier | None = InputField(
        default=None, description="The Mistral text encoder model used for FLUX.2 [dev] inference"
    )
    ideogram4_caption: str | None = InputField(
        default=None, description="The structured JSON caption encoded for Ideogram 4 inference"
    )
    hrf_enabled: bool | None = InputField(default=None, description="Whether or not high resolution fix was enabled.")
    hrf_method: str | None = InputField(default=None, description="The high resolution fix upscale method.")
    hrf_strength: float | None = InputField(
        default=None, description="The high resolution fix img2img strength used in the upscale pass."
    )
    positive_style_prompt: str | None = InputField(default=None, description="The positive style prompt parameter")
    negative_style_prompt: str | None = InputField(default=None, description="The negative style prompt parameter")
    refiner_model: ModelIdentifier | None = InputField(default=None, description="The SDXL Refiner model used")
    refiner_cfg_scale: float | None = InputField(
        default=None, description="The classifier-free guidance scale parameter used for the refiner"
    )
    refiner_steps: int | None = InputField(default=None, description="The number of steps used for the refiner")
    refiner_scheduler: str | None = InputField(default=None, description="The scheduler used for the refiner")
    refiner_positive_aesthetic_score: float | None = InputField(
        default=None, description="The aesthetic score used for the refiner"
    )
    refiner_negative_aesthetic_score: float | None = InputField(
        default=None, description="The aesthetic score used for the refiner"
    )
    refiner_start: float | None = InputField(default=None, description="The start value used for refiner denoising")

    def invoke(self, context: InvocationContext) -> MetadataOutput:
        # What was given (extra fields too), without the node's own fields, and the version that made the image.
        values: dict[str, Any] = self.model_dump(mode="json", exclude_none=True, exclude=set(NODE_FIELDS))
        values["app_version"] = app_version()
        return MetadataOutput(metadata=MetadataField.model_validate(values))
