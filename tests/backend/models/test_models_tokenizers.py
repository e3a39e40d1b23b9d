"""Tiny tokenizers (the Krea-2 template trap) and the shipped real CLIP tokenizer."""

from __future__ import annotations

import pytest
from transformers import CLIPTokenizer, Qwen2Tokenizer

from invokeai.backend.families import config_variant
from invokeai.backend.families.krea2 import constants as k2
from invokeai.backend.families.krea2 import tokenizer as k2_tokenizer
from invokeai.backend.models import tiny_tokenizers as tt


def test_qwen_template_encodes_to_the_lengths_krea2_assumes() -> None:
    tokenizer = k2_tokenizer.build_qwen_tokenizer()
    assert k2_tokenizer.template_token_counts(tokenizer) == (34, 5)
    prompt = "a red cat on a house"
    ids = tokenizer(k2.PROMPT_PREFIX + prompt)["input_ids"]
    # The pipeline keeps tokens from index 34 on: they must be exactly the prompt's.
    assert ids[k2.TEMPLATE_PREFIX_TOKENS :] == tokenizer(prompt)["input_ids"]


def test_qwen_special_tokens_are_single_ids() -> None:
    tokenizer = k2_tokenizer.build_qwen_tokenizer()
    for token in tt.QWEN_SPECIAL_TOKENS:
        assert tokenizer(token)["input_ids"] == [tokenizer.convert_tokens_to_ids(token)]
    assert tokenizer.pad_token == "<|endoftext|>"


def test_a_tokenizer_that_would_cut_the_prompt_is_refused() -> None:
    table = tt.byte_alphabet()
    vocab = {char: i for i, char in enumerate(table.values())}
    for token in tt.QWEN_SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    bytes_only = Qwen2Tokenizer(vocab=vocab, merges=[], extra_special_tokens=list(tt.QWEN_SPECIAL_TOKENS[1:]))
    with pytest.raises(ValueError, match=r"encodes to \d+ prefix / \d+ suffix tokens; the pipeline assumes 34 / 5"):
        k2_tokenizer.check_template(bytes_only)


def test_tiny_clip_tokenizer_covers_any_text() -> None:
    tokenizer = tt.build_clip_tokenizer()
    text = "A Photo of a CAT, 4k — ümlaut 東京"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.unk_token_id not in ids[1:-1]
    assert tokenizer.decode(ids, skip_special_tokens=True).replace(" ", "") == text.lower().replace(" ", "")
    assert tokenizer.convert_ids_to_tokens(tokenizer("a photo of a cat")["input_ids"]) == [
        "<|startoftext|>",
        "a</w>",
        "photo</w>",
        "of</w>",
        "a</w>",
        "cat</w>",
        "<|endoftext|>",
    ]


def test_shipped_sd1_tokenizer_is_the_real_clip_vocabulary() -> None:
    tokenizer = CLIPTokenizer.from_pretrained(config_variant("sd-1").path, subfolder="tokenizer", local_files_only=True)
    assert len(tokenizer) == 49408
    # Ids of openai/clip-vit-large-patch14 for this prompt.
    assert tokenizer("a photo of an astronaut riding a horse")["input_ids"] == [
        49406,
        320,
        1125,
        539,
        550,
        18376,
        6765,
        320,
        4558,
        49407,
    ]
    assert tokenizer.model_max_length == 77
