"""The values of the `attention_backend` and `attention_autotune` settings.

Torch-free, so that the configuration can validate the setting (and `invokeai-web --help` can list it) without
importing torch; the package's face imports this module eagerly and everything else on first use.
"""

from __future__ import annotations

from typing import Literal, get_args

AttentionSetting = Literal["auto", "sage", "cudnn", "flash", "efficient", "math"]
ATTENTION_SETTINGS: tuple[str, ...] = get_args(AttentionSetting)


def check_setting(setting: str) -> str:
    if setting not in ATTENTION_SETTINGS:
        raise ValueError(f"attention_backend {setting!r} is not valid; valid values: {', '.join(ATTENTION_SETTINGS)}")
    return setting


# `attention_autotune`: measured autotuning of the kernel per call shape (autotune.py), off by default.
AutotuneSetting = Literal["off", "on"]
AUTOTUNE_SETTINGS: tuple[str, ...] = get_args(AutotuneSetting)
# Where the server keeps the tuned choices, under its root.
AUTOTUNE_FILE_NAME = "attention_autotune.json"
