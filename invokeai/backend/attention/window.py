"""INVOKE_KREA2_SDPA_BACKEND: a benchmarking and support override for one generation.

Unset (the default) means the installed ranked list. `cudnn | efficient | flash | math` make that kernel the only
one for the window, so a call it cannot serve raises "No available kernel" and a completed run proves the kernel
served it. `priority-cudnn` ranks cuDNN first, then the installed order. Read once per generation.

PyTorch's kernel flags are process-global, so a window holds the attention lock for its whole duration and every
attention call of every other thread waits for it. From the first window on (or from startup, when the variable is
set then), every attention call takes that lock, so attention calls of different threads run one at a time for the
rest of the process: a benchmarking mode, not for production.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from torch.nn.attention import SDPBackend

from invokeai.backend.attention.install import rebind
from invokeai.backend.attention.state import STATE, WINDOW_ENV, Window

WINDOW_MODES: dict[str, Window] = {
    "cudnn": Window("cudnn", SDPBackend.CUDNN_ATTENTION, exclusive=True),
    "efficient": Window("efficient", SDPBackend.EFFICIENT_ATTENTION, exclusive=True),
    "flash": Window("flash", SDPBackend.FLASH_ATTENTION, exclusive=True),
    "math": Window("math", SDPBackend.MATH, exclusive=True),
    "priority-cudnn": Window("priority-cudnn", SDPBackend.CUDNN_ATTENTION, exclusive=False),
}


def window_mode_from_env() -> str | None:
    """The variable's value, validated; None when unset or empty."""
    raw = os.environ.get(WINDOW_ENV, "").strip()
    if not raw:
        return None
    if raw not in WINDOW_MODES:
        raise ValueError(
            f"{WINDOW_ENV}={raw!r} is not valid; valid values: unset (the ranked list), {', '.join(WINDOW_MODES)}"
        )
    return raw


@contextmanager
def sdpa_window(mode: str | None) -> Iterator[Window | None]:
    """Apply a window mode (from `window_mode_from_env`, read once per generation) for the block."""
    if mode is None:
        yield None
        return
    if mode not in WINDOW_MODES:
        raise ValueError(f"{WINDOW_ENV} mode {mode!r} is not valid; valid values: {', '.join(WINDOW_MODES)}")
    if not STATE.installed:
        raise RuntimeError(f"{WINDOW_ENV} needs the attention policy installed first (install_attention)")
    with STATE.lock:
        if STATE.window is not None:
            raise RuntimeError(f"an {WINDOW_ENV} window ({STATE.window.mode}) is already open")
        if not STATE.serialize:
            STATE.serialize = True
            rebind()
        STATE.window = WINDOW_MODES[mode]
        STATE.apply()
        try:
            yield STATE.window
        finally:
            STATE.window = None
            STATE.apply()
