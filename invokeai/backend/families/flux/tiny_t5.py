"""A small T5 (SentencePiece-style Unigram) tokenizer built in memory, so the FLUX demo model needs no download.

The layout is T5's: <pad> = 0, </s> = 1, <unk> = 2, then the Metaspace word-start symbol, whole words and single
characters; every prompt ends with </s>, as the real tokenizer ends it. Characters it does not cover become <unk>.
"""

from __future__ import annotations

import string

from transformers import T5Tokenizer

_WORDS = "a an the of in on photo picture cat dog red blue green house tree sky painting portrait"


def build_t5_tokenizer(model_max_length: int = 512) -> T5Tokenizer:
    vocab: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    # Unigram picks the segmentation with the best total score: whole words beat their letters.
    vocab += [("\u2581" + word, -1.0) for word in _WORDS.split()]
    vocab += [(char, -5.0) for char in string.ascii_letters + string.digits + string.punctuation]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=model_max_length)
