"""Attention for the whole server: PyTorch's SDPA kernels ranked once per process, a pinnable `attention_backend`,
per-node reports of calls the pinned kernel could not serve, and dispatcher-priced score matrices.

Depends on torch and the standard library only, so it runs wherever torch does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend.attention import stats as _stats
from invokeai.backend.attention.caller import NO_NODE, attention_caller, current_node_type
from invokeai.backend.attention.install import install_attention, uninstall_attention
from invokeai.backend.attention.kernels import ATTENTION_SETTINGS, AUTO_ORDER, kernel_order
from invokeai.backend.attention.memory import sdpa_score_matrix_bytes
from invokeai.backend.attention.routing import make_router, public_kernel
from invokeai.backend.attention.state import STATE as _STATE
from invokeai.backend.attention.state import WINDOW_ENV
from invokeai.backend.attention.step_benchmark import StepBenchmark, step_benchmark
from invokeai.backend.attention.window import WINDOW_MODES, sdpa_window, window_mode_from_env

__all__ = [
    "ATTENTION_SETTINGS",
    "AUTO_ORDER",
    "NO_NODE",
    "WINDOW_ENV",
    "WINDOW_MODES",
    "StepBenchmark",
    "attention_caller",
    "attention_stats",
    "current_node_type",
    "install_attention",
    "kernel_order",
    "sdpa_score_matrix_bytes",
    "sdpa_window",
    "serving_kernel",
    "step_benchmark",
    "uninstall_attention",
    "window_mode_from_env",
]


def serving_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> SDPBackend | str:
    """Which kernel would serve this exact call under the installed policy: an SDPBackend, or "sage"."""
    router = _STATE.router if _STATE.router is not None else make_router(_STATE)
    return public_kernel(router(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa))


def attention_stats() -> dict[str, Any]:
    """The setting, the installed order, the startup probe, every report so far, and calls per node and kernel."""
    window = _STATE.window
    return {
        "setting": _STATE.setting,
        "installed": _STATE.installed,
        "order": [kernel.name for kernel in _STATE.order] if _STATE.installed else [],
        "torch_priority_order": [SDPBackend(b).name for b in torch._C._get_sdp_priority_order()],
        "cudnn_demoted": _STATE.cudnn_demoted,
        "window": window.mode if window is not None else None,
        "probe": _STATE.probe,
        "unavailable": sorted(_STATE.unavailable),
        "sage": _STATE.sage.version if _STATE.sage is not None else None,
        "reports": list(_stats.reports),
        "events": list(_stats.events),
        "counts": _stats.call_counts(),
    }
