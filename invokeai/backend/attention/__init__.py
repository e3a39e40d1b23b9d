"""Attention for the whole server: PyTorch's SDPA kernels ranked once per process, a pinnable `attention_backend`,
per-node reports of calls the pinned kernel could not serve, and dispatcher-priced score matrices.

Depends on torch and the standard library only, so it runs wherever torch does. Where each concern lives:
docs/attention.md, "Layout".

The face loads lazily: `settings` (torch-free) is imported here, every other name on first use, so the configuration
can validate `attention_backend` without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from invokeai.backend.attention.settings import (
    ATTENTION_SETTINGS,
    AUTOTUNE_FILE_NAME,
    AUTOTUNE_SETTINGS,
    AttentionSetting,
    AutotuneSetting,
)

if TYPE_CHECKING:
    from invokeai.backend.attention.caller import (
        NO_DEVICE,
        NO_NODE,
        attention_caller,
        current_device,
        current_node_type,
    )
    from invokeai.backend.attention.install import install_attention, uninstall_attention
    from invokeai.backend.attention.memory import sdpa_score_matrix_bytes
    from invokeai.backend.attention.policy import kernel_order
    from invokeai.backend.attention.routing import serving_kernel
    from invokeai.backend.attention.stats import AttentionStats, attention_stats

# Each public name and the module that holds it.
_HOMES: dict[str, str] = {
    "kernel_order": "policy",
    "install_attention": "install",
    "uninstall_attention": "install",
    "attention_caller": "caller",
    "current_node_type": "caller",
    "current_device": "caller",
    "NO_NODE": "caller",
    "NO_DEVICE": "caller",
    "serving_kernel": "routing",
    "sdpa_score_matrix_bytes": "memory",
    "attention_stats": "stats",
    "AttentionStats": "stats",
}

__all__ = [
    "ATTENTION_SETTINGS",
    "AUTOTUNE_FILE_NAME",
    "AUTOTUNE_SETTINGS",
    "NO_DEVICE",
    "NO_NODE",
    "AttentionSetting",
    "AttentionStats",
    "AutotuneSetting",
    "attention_caller",
    "attention_stats",
    "current_device",
    "current_node_type",
    "install_attention",
    "kernel_order",
    "sdpa_score_matrix_bytes",
    "serving_kernel",
    "uninstall_attention",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
