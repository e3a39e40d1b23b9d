"""The demo Krea-2 model's tokenizer: a small byte-level Qwen2 BPE built in memory, whose chat-template prefix and
suffix encode to the token counts Krea2Pipeline assumes (it drops a fixed number of leading tokens, its system
prompt, from the encoder output)."""

from __future__ import annotations

from transformers import Qwen2Tokenizer

from invokeai.backend.families.krea2.constants import (
    PROMPT_PREFIX,
    PROMPT_SUFFIX,
    TEMPLATE_PREFIX_TOKENS,
    TEMPLATE_SUFFIX_TOKENS,
)
from invokeai.backend.models.tiny_tokenizers import build_qwen2_tokenizer

# Words that become single tokens. In Qwen's BPE a leading space belongs to the word: the template's words that
# start a line have none, all others do.
_QWEN_LINE_START_WORDS = "system user assistant Describe"
_QWEN_WORDS = (
    "the image by detailing color shape size texture quantity text spatial relationships objects background of and "
    "a photo cat dog red blue green house tree sky"
)


def build_qwen_tokenizer(model_max_length: int = 1024) -> Qwen2Tokenizer:
    """A Qwen2 tokenizer whose Krea-2 template prefix and suffix encode to the lengths the pipeline assumes."""
    tokenizer = build_qwen2_tokenizer(_QWEN_WORDS, _QWEN_LINE_START_WORDS, model_max_length)
    check_template(tokenizer)
    return tokenizer


def template_token_counts(tokenizer: Qwen2Tokenizer) -> tuple[int, int]:
    """How many tokens the tokenizer gives the Krea-2 template prefix and suffix."""
    prefix = tokenizer(PROMPT_PREFIX)["input_ids"]
    suffix = tokenizer(PROMPT_SUFFIX)["input_ids"]
    return len(prefix), len(suffix)


def check_template(tokenizer: Qwen2Tokenizer) -> None:
    """Refuse a tokenizer with which Krea2Pipeline would cut the user prompt away (or keep system-prompt tokens)."""
    prefix, suffix = template_token_counts(tokenizer)
    if (prefix, suffix) != (TEMPLATE_PREFIX_TOKENS, TEMPLATE_SUFFIX_TOKENS):
        raise ValueError(
            f"Krea-2 template encodes to {prefix} prefix / {suffix} suffix tokens; the pipeline assumes "
            f"{TEMPLATE_PREFIX_TOKENS} / {TEMPLATE_SUFFIX_TOKENS}"
        )
