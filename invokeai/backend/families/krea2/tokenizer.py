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
from invokeai.backend.models.tiny_tokenizers import byte_alphabet, chain_merges, encode_word, vocab_from

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
)

# Words that become single tokens. In Qwen's BPE a leading space belongs to the word: the template's words that
# start a line have none, all others do.
_QWEN_LINE_START_WORDS = "system user assistant Describe"
_QWEN_WORDS = (
    "the image by detailing color shape size texture quantity text spatial relationships objects background of and "
    "a photo cat dog red blue green house tree sky"
)


def build_qwen_tokenizer(model_max_length: int = 1024) -> Qwen2Tokenizer:
    """A Qwen2 tokenizer whose Krea-2 template prefix and suffix encode to the lengths the pipeline assumes."""
    table = byte_alphabet()
    # Space-led words' merges rank first: BPE applies the lowest-ranked pair anywhere in a word, so a line-start
    # word's first merge (say "u"+"s") ranked above them would fire inside a longer word and break its chain.
    words = [encode_word(" " + word, table) for word in _QWEN_WORDS.split()]
    words += [encode_word(word, table) for word in _QWEN_LINE_START_WORDS.split()]
    merges = chain_merges(words)
    vocab = vocab_from(list(table.values()), merges, QWEN_SPECIAL_TOKENS)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        model_max_length=model_max_length,
        extra_special_tokens=list(QWEN_SPECIAL_TOKENS[1:]),
    )
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
