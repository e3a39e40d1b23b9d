"""Small byte-level BPE tokenizers built in memory, so demo models need no download.

Both tokenizers cover every byte (any prompt encodes), plus whole-word merges for the words the pipelines' fixed
templates use. The Krea-2 pipeline drops a fixed number of leading tokens (its system prompt) from the encoder
output, so the Qwen tokenizer must encode that prefix to exactly that many tokens; `build_qwen_tokenizer` checks it.
"""

from __future__ import annotations

from collections.abc import Iterable

from transformers import CLIPTokenizer, Qwen2Tokenizer

# The Krea-2 pipeline's chat template (diffusers' Krea2Pipeline sets these in __init__, not in its config), and the
# token counts it assumes the real Qwen tokenizer gives them.
KREA2_TEMPLATE_PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"
)
KREA2_TEMPLATE_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
KREA2_PREFIX_TOKENS = 34
KREA2_SUFFIX_TOKENS = 5

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
_CLIP_WORDS = "a an the of in on photo picture cat dog red blue green house tree sky painting portrait"


def byte_alphabet() -> dict[int, str]:
    """Byte -> printable character, the mapping byte-level BPE vocabularies (GPT-2, CLIP, Qwen) are written in.

    Printable Latin-1 bytes stand for themselves; the others (controls, space, soft hyphen) are moved to code points
    256 and up, in byte order. The dict's order is the order real CLIP vocabularies give the 256 base tokens.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _encode_word(word: str, alphabet: dict[int, str]) -> list[str]:
    return [alphabet[b] for b in word.encode("utf-8")]


def chain_merges(symbol_words: Iterable[list[str]]) -> list[tuple[str, str]]:
    """Merges that grow each word left to right from its first symbol, so the whole word ends as one token.

    Shared prefixes share merges; a merge is listed once, at its first use, which keeps ranks deterministic.
    """
    merges: dict[tuple[str, str], None] = {}
    for symbols in symbol_words:
        prefix = symbols[0]
        for symbol in symbols[1:]:
            merges.setdefault((prefix, symbol), None)
            prefix += symbol
    return list(merges)


def _vocab_from(base: list[str], merges: list[tuple[str, str]], specials: Iterable[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for token in [*base, *(a + b for a, b in merges), *specials]:
        vocab.setdefault(token, len(vocab))
    return vocab


def build_clip_tokenizer(model_max_length: int = 77) -> CLIPTokenizer:
    """A CLIP tokenizer with the real layout (bytes, bytes + '</w>', merges, then the two specials last)."""
    alphabet = list(byte_alphabet().values())
    base = alphabet + [c + "</w>" for c in alphabet]
    table = byte_alphabet()
    words = []
    for word in _CLIP_WORDS.split():
        symbols = _encode_word(word, table)
        symbols[-1] += "</w>"
        if len(symbols) > 1:
            words.append(symbols)
    merges = chain_merges(words)
    vocab = _vocab_from(base, merges, ("<|startoftext|>", "<|endoftext|>"))
    # transformers 5 wants merges as tuples here; a vocab_file/merges_file pair would be silently ignored.
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=model_max_length)


def build_qwen_tokenizer(model_max_length: int = 1024) -> Qwen2Tokenizer:
    """A Qwen2 tokenizer whose Krea-2 template prefix and suffix encode to the lengths the pipeline assumes."""
    table = byte_alphabet()
    # Space-led words' merges rank first: BPE applies the lowest-ranked pair anywhere in a word, so a line-start
    # word's first merge (say "u"+"s") ranked above them would fire inside a longer word and break its chain.
    words = [_encode_word(" " + word, table) for word in _QWEN_WORDS.split()]
    words += [_encode_word(word, table) for word in _QWEN_LINE_START_WORDS.split()]
    merges = chain_merges(words)
    vocab = _vocab_from(list(table.values()), merges, QWEN_SPECIAL_TOKENS)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        model_max_length=model_max_length,
        extra_special_tokens=list(QWEN_SPECIAL_TOKENS[1:]),
    )
    check_krea2_template(tokenizer)
    return tokenizer


def template_token_counts(tokenizer: Qwen2Tokenizer) -> tuple[int, int]:
    """How many tokens the tokenizer gives the Krea-2 template prefix and suffix."""
    prefix = tokenizer(KREA2_TEMPLATE_PREFIX)["input_ids"]
    suffix = tokenizer(KREA2_TEMPLATE_SUFFIX)["input_ids"]
    return len(prefix), len(suffix)


def check_krea2_template(tokenizer: Qwen2Tokenizer) -> None:
    """Refuse a tokenizer with which Krea2Pipeline would cut the user prompt away (or keep system-prompt tokens)."""
    prefix, suffix = template_token_counts(tokenizer)
    if (prefix, suffix) != (KREA2_PREFIX_TOKENS, KREA2_SUFFIX_TOKENS):
        raise ValueError(
            f"Krea-2 template encodes to {prefix} prefix / {suffix} suffix tokens; the pipeline assumes "
            f"{KREA2_PREFIX_TOKENS} / {KREA2_SUFFIX_TOKENS}"
        )
