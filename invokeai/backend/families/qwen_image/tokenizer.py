"""The demo Qwen-Image model's tokenizer: a small byte-level Qwen2 BPE built in memory whose template prefix (the
system prompt) encodes to the TEMPLATE_PREFIX_TOKENS tokens QwenImagePipeline drops from the encoder output."""

from __future__ import annotations

from typing import Any

from invokeai.backend.families.qwen_image.constants import (
    EDIT_SYSTEM_PROMPT,
    EDIT_TEMPLATE_PREFIX_TOKENS,
    PROMPT_TEMPLATE,
    TEMPLATE_PREFIX,
    TEMPLATE_PREFIX_TOKENS,
)
from invokeai.backend.models.tiny_tokenizers import build_qwen2_tokenizer

# Words that become single tokens. In Qwen's BPE a leading space belongs to the word: the template's words that
# start a line have none, all others do.
_LINE_START_WORDS = "system user assistant Describe"
_WORDS = (
    "the image by detailing color shape size texture quantity text spatial relationships objects background of and "
    "a an in on photo painting portrait cat dog red blue green house tree sky"
)


def build_tokenizer(model_max_length: int = 2048) -> Any:
    tokenizer = build_qwen2_tokenizer(_WORDS, _LINE_START_WORDS, model_max_length)
    check_template(tokenizer)
    return tokenizer


def template_tokens(tokenizer: Any, prompt: str) -> int:
    """How many tokens the text encoder sees for `prompt`: the templated prompt, before the pipeline's cut."""
    return len(tokenizer(PROMPT_TEMPLATE.format(prompt)).input_ids)


def check_template(tokenizer: Any) -> None:
    """Refuse a tokenizer with which the pipeline would cut the prompt away (or keep system-prompt tokens): the
    prefix must encode to the tokens it drops, and the prompt's tokens must follow them unchanged."""
    prefix = len(tokenizer(TEMPLATE_PREFIX).input_ids)
    if prefix != TEMPLATE_PREFIX_TOKENS:
        raise ValueError(
            f"this tokenizer encodes the Qwen-Image template prefix to {prefix} tokens; the pipeline drops "
            f"{TEMPLATE_PREFIX_TOKENS}, so the prompt would be cut"
        )


# Qwen-Image-Edit's system prompt, in words that make its prefix EDIT_TEMPLATE_PREFIX_TOKENS tokens: "(" after a
# space, and "color", "'s" and ")," after punctuation, are single tokens too.
_EDIT_LINE_START_WORDS = "system user Describe color 's ),"
_EDIT_WORDS = (
    "( the key features of input image shape size texture objects background then explain how user text instruction "
    "should alter or modify Generate a new that meets requirements while maintaining consistency with original where "
    "appropriate Picture photo painting portrait cat dog red blue green house tree sky make it"
)


def build_edit_tokenizer(model_max_length: int = 4096) -> Any:
    """The demo Qwen-Image-Edit model's tokenizer: its system prefix encodes to the tokens the Edit pipelines drop."""
    tokenizer = build_qwen2_tokenizer(_EDIT_WORDS, _EDIT_LINE_START_WORDS, model_max_length)
    prefix = len(tokenizer(EDIT_SYSTEM_PROMPT).input_ids)
    if prefix != EDIT_TEMPLATE_PREFIX_TOKENS:
        raise ValueError(
            f"this tokenizer encodes the Qwen-Image-Edit system prefix to {prefix} tokens; the pipelines drop "
            f"{EDIT_TEMPLATE_PREFIX_TOKENS}, so the prompt would be cut"
        )
    return tokenizer
