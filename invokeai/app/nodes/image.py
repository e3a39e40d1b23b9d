"""Image nodes: Pillow operations whose results go through the images service."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from PIL import Image
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from invokeai.app.nodes.base import (
    BaseInvocation,
    BaseInvocationOutput,
    ImageField,
    Input,
    InputField,
    InvocationContext,
    OutputField,
)
from invokeai.app.nodes.model_fields import MetadataField

# Large enough for any real use, small enough that one node cannot exhaust the server's memory.
MAX_DIMENSION = 8192
HEX_COLOR = re.compile(r"#[0-9a-fA-F]{6}([0-9a-fA-F]{2})?")


class ColorField(BaseModel):
    """InvokeAI's color: red, green, blue and alpha, each 0-255."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(ge=0, le=255, description="The red component")
    g: int = Field(ge=0, le=255, description="The green component")
    b: int = Field(ge=0, le=255, description="The blue component")
    a: int = Field(ge=0, le=255, description="The alpha component")

    def tuple(self) -> tuple[int, int, int, int]:
        return (self.r, self.g, self.b, self.a)


def _color_from_hex(value: Any) -> Any:
    # This server's graphs gave colors as "#rrggbb" or "#rrggbbaa" before it took InvokeAI's ColorField; such a
    # string is still read (into the ColorField), while the schema shows InvokeAI's object alone.
    if not isinstance(value, str):
        return value
    if HEX_COLOR.fullmatch(value) is None:
        raise ValueError('a color is an object {"r", "g", "b", "a"} (each 0-255), or a string "#rrggbb" or "#rrggbbaa"')
    channels = [int(value[i : i + 2], 16) for i in range(1, len(value), 2)]
    return ColorField(r=channels[0], g=channels[1], b=channels[2], a=channels[3] if len(channels) == 4 else 255)


Color = Annotated[ColorField, BeforeValidator(_color_from_hex)]


class BoardField(BaseModel):
    """InvokeAI's board of an image (its `board` input on image nodes)."""

    model_config = ConfigDict(extra="forbid")

    board_id: str = Field(max_length=255, description="The id of the board; 'none': no board")


def board_input() -> Any:
    """InvokeAI's `board` input of an image node: set in the graph, not connected."""
    return InputField(default=None, input=Input.DIRECT, description="The board to save the image to")


def metadata_input() -> Any:
    """InvokeAI's `metadata` input of an image node: core_metadata's output, written into the PNG."""
    # Connected from core_metadata by InvokeAI's graph builders; its clients may also set it as a value.
    return InputField(default=None, description="Optional metadata to be saved with the image")


class ImageOutput(BaseInvocationOutput):
    type: Literal["image_output"] = "image_output"
    image: ImageField = OutputField(description="The output image")
    width: int = OutputField(description="The width of the image in pixels")
    height: int = OutputField(description="The height of the image in pixels")

    @classmethod
    def of(cls, field: ImageField, image: Image.Image) -> ImageOutput:
        return cls(image=field, width=image.width, height=image.height)

    @classmethod
    def saved(
        cls,
        context: InvocationContext,
        image: Image.Image,
        *,
        metadata: MetadataField | None = None,
        board: BoardField | None = None,
    ) -> ImageOutput:
        """`image` stored as the node's result, with InvokeAI's `metadata` input in the PNG and on its `board`
        input's board ('none', as InvokeAI's clients spell no board, puts it on none)."""
        board_id = board.board_id if board is not None and board.board_id != "none" else None
        stored = context.save_image(image, metadata=metadata.root if metadata is not None else None, board_id=board_id)
        return cls.of(stored, image)


class ResampleMode(StrEnum):
    NEAREST = "nearest"
    BOX = "box"
    BILINEAR = "bilinear"
    HAMMING = "hamming"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"

    @property
    def pil(self) -> Image.Resampling:
        return Image.Resampling[self.name]


class BlankImageInvocation(BaseInvocation):
    """A new image of one color, as InvokeAI's blank_image: `mode` RGB drops the color's alpha, RGBA keeps it."""

    type: Literal["blank_image"] = "blank_image"
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    width: int = InputField(default=512, ge=1, le=MAX_DIMENSION, description="The width of the image")
    height: int = InputField(default=512, ge=1, le=MAX_DIMENSION, description="The height of the image")
    mode: Literal["RGB", "RGBA"] = InputField(default="RGB", description="The mode of the image")
    color: Color = InputField(
        default=ColorField(r=0, g=0, b=0, a=255),
        description='The color of the image (a string "#rrggbb" or "#rrggbbaa" is also read)',
    )

    def invoke(self, context: InvocationContext) -> ImageOutput:
        image = Image.new(self.mode, (self.width, self.height), self.color.tuple())
        context.check_canceled()
        return ImageOutput.saved(context, image, metadata=self.metadata, board=self.board)


class ImageResizeInvocation(BaseInvocation):
    """The image resized to exactly width x height."""

    type: Literal["image_resize"] = "image_resize"
    image: ImageField = InputField(description="The image to resize")
    width: int = InputField(default=512, ge=1, le=MAX_DIMENSION, description="The width of the result")
    height: int = InputField(default=512, ge=1, le=MAX_DIMENSION, description="The height of the result")
    resample_mode: ResampleMode = InputField(default=ResampleMode.BICUBIC, description="The resampling filter")

    def invoke(self, context: InvocationContext) -> ImageOutput:
        image = context.load_image(self.image)
        context.check_canceled()
        resized = image.resize((self.width, self.height), resample=self.resample_mode.pil)
        context.check_canceled()
        return ImageOutput.of(context.save_image(resized), resized)


class ImageBlendInvocation(BaseInvocation):
    """image_a * (1 - alpha) + image_b * alpha, with image_b resized to image_a's size where they differ."""

    type: Literal["image_blend"] = "image_blend"
    image_a: ImageField = InputField(description="The first image; the result has its size")
    image_b: ImageField = InputField(description="The second image")
    alpha: float = InputField(default=0.5, ge=0.0, le=1.0, description="The weight of image_b")

    def invoke(self, context: InvocationContext) -> ImageOutput:
        image_a = context.load_image(self.image_a)
        image_b = context.load_image(self.image_b)
        context.check_canceled()
        # Image.blend needs one mode; keep transparency if either image has it.
        has_alpha = any(image.has_transparency_data for image in (image_a, image_b))
        mode = "RGBA" if has_alpha else "RGB"
        image_a, image_b = image_a.convert(mode), image_b.convert(mode)
        if image_b.size != image_a.size:
            image_b = image_b.resize(image_a.size, resample=Image.Resampling.BICUBIC)
        blended = Image.blend(image_a, image_b, self.alpha)
        context.check_canceled()
        return ImageOutput.of(context.save_image(blended), blended)


PilResample = Literal["nearest", "box", "bilinear", "hamming", "bicubic", "lanczos"]


class ImgResizeInvocation(BaseInvocation):
    """InvokeAI's img_resize: the image resized to exactly width x height (with its metadata in the PNG)."""

    type: Literal["img_resize"] = "img_resize"
    board: BoardField | None = board_input()
    metadata: MetadataField | None = metadata_input()
    image: ImageField = InputField(description="The image to resize")
    width: int = InputField(default=512, gt=0, le=MAX_DIMENSION, description="The width to resize to (px)")
    height: int = InputField(default=512, gt=0, le=MAX_DIMENSION, description="The height to resize to (px)")
    resample_mode: PilResample = InputField(default="bicubic", description="The resampling mode")

    def invoke(self, context: InvocationContext) -> ImageOutput:
        image = context.load_image(self.image)
        context.check_canceled()
        resized = image.resize((self.width, self.height), resample=ResampleMode(self.resample_mode).pil)
        context.check_canceled()
        return ImageOutput.saved(context, resized, metadata=self.metadata, board=self.board)
