"""The demo Z-Image model's tokenizer: a small byte-level Qwen2 BPE built in memory, with a chat template, so
ZImagePipeline's `apply_chat_template` runs offline.

The template renders what Qwen3's own template renders for one user message with a generation prompt and thinking
enabled (the pipeline's call): "<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n". Its words and
specials are single tokens, so an empty prompt encodes to constants.EMPTY_PROMPT_TOKENS tokens, as with the real one.
"""

from __future__ import annotations

from transformers import Qwen2Tokenizer

from invokeai.backend.families.zimage.constants import EMPTY_PROMPT_TOKENS, TEXT_TOKENS
from invokeai.backend.models.tiny_tokenizers import byte_alphabet, chain_merges, encode_word, vocab_from

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Words that become single tokens. In Qwen's BPE a leading space belongs to the word; the template's role names
# start a line and have none.
_LINE_START_WORDS = "user assistant"
_WORDS = "a an the of in on photo picture cat dog red blue green house tree sky painting portrait"


def build_tokenizer(model_max_length: int = 4 * TEXT_TOKENS) -> Qwen2Tokenizer:
    table = byte_alphabet()
    # Space-led words' merges rank first, so a line-start word's first merge cannot fire inside a longer word.
    words = [encode_word(" " + word, table) for word in _WORDS.split()]
    words += [encode_word(word, table) for word in _LINE_START_WORDS.split()]
    merges = chain_merges(words)
    vocab = vocab_from(list(table.values()), merges, SPECIAL_TOKENS)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        model_max_length=model_max_length,
        extra_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    empty = template_tokens(tokenizer, "")
    if empty != EMPTY_PROMPT_TOKENS:
        raise ValueError(f"the demo chat template encodes an empty prompt to {empty} tokens, not {EMPTY_PROMPT_TOKENS}")
    return tokenizer


def template_tokens(tokenizer: Qwen2Tokenizer, prompt: str) -> int:
    """How many tokens the pipeline's chat-templated `prompt` encodes to (before padding)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    return len(tokenizer(text).input_ids)
