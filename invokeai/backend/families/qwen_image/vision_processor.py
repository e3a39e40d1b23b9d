"""Qwen-Image-Edit's processor: transformers' Qwen2-VL processor (the templated prompt's image placeholders expanded
to as many tokens as the vision tower makes of each image, the images cut into patches), read from a pipeline
folder's processor/ files.

transformers' Qwen2VLProcessor cannot be constructed where torchvision is missing, images only or not: its
constructor checks the video processor's class through a mapping that then does not exist (transformers issue
#48558). `ImageProcessing` is that processor without the video part: the same call (ProcessorMixin's), the same image
processor (AutoImageProcessor's choice from preprocessor_config.json, which falls back to the PIL backend without
torchvision, as the stock processor's does) and the same tokenizer, so it gives the stock processor's tensors for
any prompt and images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin

SUBFOLDER = "processor"


class ImageProcessing(Qwen2VLProcessor):
    """Qwen2VLProcessor for prompts with images (no video processor, so no torchvision)."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None) -> None:
        # Qwen2VLProcessor.__init__'s token bookkeeping, then ProcessorMixin's with the two sub-processors only.
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        self.image_token_id = getattr(tokenizer, "image_token_id", None) or tokenizer.convert_tokens_to_ids(
            self.image_token
        )
        self.video_token_id = getattr(tokenizer, "video_token_id", None) or tokenizer.convert_tokens_to_ids(
            self.video_token
        )
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


def load_processor(folder: Path) -> ImageProcessing:
    """The processor of a Qwen-Image-Edit pipeline folder (its processor/ subfolder: preprocessor_config.json and
    the tokenizer's files), offline."""
    source = Path(folder) / SUBFOLDER
    if not (source / "preprocessor_config.json").is_file():
        raise FileNotFoundError(
            f"{Path(folder).name}: no {SUBFOLDER}/preprocessor_config.json; a Qwen-Image-Edit pipeline folder has "
            "its Qwen2-VL processor there"
        )
    image_processor = AutoImageProcessor.from_pretrained(str(source), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    return ImageProcessing(image_processor=image_processor, tokenizer=tokenizer)
