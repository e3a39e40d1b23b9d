"""Small tokenizers built in memory, so demo models need no download.

Byte-level vocabularies cover every byte (any prompt encodes), plus whole-word merges for a few words, so common
prompts are short. The CLIP tokenizer is here, the Qwen2 BPE (Qwen's special tokens, the words a family's chat
template needs as single tokens) and a T5 SentencePiece-style Unigram (FLUX.1's text encoder, Anima's adapter
queries); a family whose pipeline needs another builds it from these parts in its own folder.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from transformers import CLIPTokenizer, Qwen2Tokenizer, T5Tokenizer

_CLIP_WORDS = "a an the of in on photo picture cat dog red blue green house tree sky painting portrait"

# Qwen's special tokens of its chat and vision templates, in the order the real vocabularies list them.
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
)


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


def encode_word(word: str, alphabet: dict[int, str]) -> list[str]:
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


def vocab_from(base: list[str], merges: list[tuple[str, str]], specials: Iterable[str]) -> dict[str, int]:
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
        symbols = encode_word(word, table)
        symbols[-1] += "</w>"
        if len(symbols) > 1:
            words.append(symbols)
    merges = chain_merges(words)
    vocab = vocab_from(base, merges, ("<|startoftext|>", "<|endoftext|>"))
    # transformers 5 wants merges as tuples here; a vocab_file/merges_file pair would be silently ignored.
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=model_max_length)


def build_qwen2_tokenizer(
    words: str, line_start_words: str, model_max_length: int, specials: tuple[str, ...] = QWEN_SPECIAL_TOKENS
) -> Qwen2Tokenizer:
    """A byte-level Qwen2 BPE whose `words` (space-separated) encode to one token each after a space, as Qwen's BPE
    keeps the leading space with the word, and whose `line_start_words` do so at the start of a line. `specials`
    follow the merges; the first is the end-of-text and padding token."""
    table = byte_alphabet()
    # Space-led words' merges rank first: BPE applies the lowest-ranked pair anywhere in a word, so a line-start
    # word's first merge (say "u"+"s") ranked above them would fire inside a longer word and break its chain.
    symbol_words = [encode_word(" " + word, table) for word in words.split()]
    symbol_words += [encode_word(word, table) for word in line_start_words.split()]
    merges = chain_merges(symbol_words)
    vocab = vocab_from(list(table.values()), merges, specials)
    return Qwen2Tokenizer(
        vocab=vocab, merges=merges, model_max_length=model_max_length, extra_special_tokens=list(specials[1:])
    )


_T5_WORDS = "a an the of in on photo picture cat dog red blue green house tree sky painting portrait"


def build_t5_tokenizer(model_max_length: int = 512) -> T5Tokenizer:
    """A T5 tokenizer with the real layout: <pad> = 0, </s> = 1, <unk> = 2, then the Metaspace word-start symbol,
    whole words and single characters; every prompt ends with </s>, as the real tokenizer ends it. Characters it
    does not cover become <unk>."""
    vocab: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    # Unigram picks the segmentation with the best total score: whole words beat their letters.
    vocab += [("\u2581" + word, -1.0) for word in _T5_WORDS.split()]
    vocab += [(char, -5.0) for char in string.ascii_letters + string.digits + string.punctuation]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=model_max_length)
