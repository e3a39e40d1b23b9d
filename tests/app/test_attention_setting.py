"""The attention_backend setting accepts exactly the values the attention package knows."""

from __future__ import annotations

from typing import get_args

from invokeai.app.config.settings import ATTENTION_BACKENDS, AttentionBackend


def test_setting_values_match_the_attention_package() -> None:
    from invokeai.backend.attention import ATTENTION_SETTINGS

    assert get_args(AttentionBackend) == ATTENTION_SETTINGS
    assert ATTENTION_BACKENDS == ATTENTION_SETTINGS
