"""Benchmarking tools, not part of the generic face: a window over PyTorch's kernel flags for one generation, and
a per-step timer for a denoise loop. A model family that offers them decides when (Krea-2 reads
INVOKE_KREA2_SDPA_BACKEND once per generation).

A window's exclusive modes (`cudnn | efficient | flash | math`) make that kernel the only one, so a call it cannot
serve raises "No available kernel" and a completed run proves the kernel served it; `priority-cudnn` ranks cuDNN
first, then the installed order. PyTorch's kernel flags are process-global, so a window holds the attention lock
for its whole duration, and from the first window on every attention call of every thread takes that lock: calls
of different threads run one at a time for the rest of the process. Opening the first window waits for the calls
already running without the lock, so none of them runs under the window's flags, and a window opened meanwhile
waits for that wait too. Compiled and exported graphs call the aten op directly and never take the lock.
"""

from __future__ import annotations

import logging
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend.attention.policy import Window
from invokeai.backend.attention.state import STATE, AttentionState

logger = logging.getLogger(__name__)

WINDOW_MODES: dict[str, tuple[SDPBackend, bool]] = {
    "cudnn": (SDPBackend.CUDNN_ATTENTION, True),
    "efficient": (SDPBackend.EFFICIENT_ATTENTION, True),
    "flash": (SDPBackend.FLASH_ATTENTION, True),
    "math": (SDPBackend.MATH, True),
    "priority-cudnn": (SDPBackend.CUDNN_ATTENTION, False),
}


def _outermost_frames(code: CodeType) -> dict[int, FrameType]:
    """Each other thread's outermost frame running `code` (a TorchFunctionMode's callback nests one call in
    another), by thread id."""
    me = threading.get_ident()
    found: dict[int, FrameType] = {}
    for ident, frame in sys._current_frames().items():
        walk: FrameType | None = frame
        while ident != me and walk is not None:
            if walk.f_code is code:
                found[ident] = walk
            walk = walk.f_back
    return found


def _wait_for_unlocked_calls(state: AttentionState) -> None:
    """Wait until the calls other threads are making now have returned. Called once `serialize` is set, so a call
    that starts from now on takes the lock (and waits for the window); one already inside (past that check) finishes
    under the flags it started with. Only the calls in flight now are waited for: calls that keep coming take the
    lock in turn, and waiting for a moment with none inside could wait for ever. Reading the threads' frames costs
    the hot path nothing."""
    assert state.public is not None
    in_flight = _outermost_frames(state.public.__code__)
    while in_flight:
        time.sleep(0.001)
        stacks = sys._current_frames()
        for ident, outer in list(in_flight.items()):
            # The frame object stays alive while it is held here, so `is` cannot match a later call's frame.
            walk: FrameType | None = stacks.get(ident)
            while walk is not None and walk is not outer:
                walk = walk.f_back
            if walk is None:
                del in_flight[ident]


@contextmanager
def sdpa_window(mode: str | None, source: str = "benchmarking") -> Iterator[Window | None]:
    """Apply a window mode for the block (None: no window). `source` names what asked for it in reports, e.g.
    "INVOKE_KREA2_SDPA_BACKEND=cudnn"."""
    if mode is None:
        yield None
        return
    if mode not in WINDOW_MODES:
        raise ValueError(f"benchmarking window mode {mode!r} is not valid; valid values: {', '.join(WINDOW_MODES)}")
    state = STATE
    if not state.installed:
        raise RuntimeError(f"the {source} window needs the attention policy installed first (install_attention)")
    with state.lock:
        if state.window is not None:
            raise RuntimeError(f"a benchmarking window ({state.window.source}) is already open")
        first = not state.serialize
        if first:
            state.serialize = True
            state.draining = threading.Event()
        draining = state.draining
    if first and draining is not None:
        try:
            _wait_for_unlocked_calls(state)
        finally:
            draining.set()
    elif draining is not None:
        # The first window is still waiting for the calls in flight: a window that opened now would apply its
        # flags to those calls. Every window waits until that wait is over.
        draining.wait()
    kernel, exclusive = WINDOW_MODES[mode]
    with state.lock:
        if state.window is not None:
            raise RuntimeError(f"a benchmarking window ({state.window.source}) is already open")
        installation = state.installation
        state.window = Window(mode, kernel, exclusive, source)
        state.apply()
        try:
            yield state.window
        finally:
            # An uninstall (or a re-install) inside the window has put its own flags in place: keep them.
            if state.installation == installation:
                state.window = None
                state.apply()


class StepBenchmark:
    """Per-step timing of a denoise loop on CUDA. Each step is bracketed by `torch.cuda.synchronize()`, which
    serialises the loop: only build one when asked. The peak-memory counter is reset right before the loop so the
    figure is the loop's, not the model load's; the first step is reported apart because it absorbs kernel
    selection and allocator warm-up."""

    def __init__(self, device: torch.device, mode: str, label: str) -> None:
        self.device = device
        self.mode = mode
        self.label = label
        self.step_seconds: list[float] = []

    def _synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def _peak_memory_bytes(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def start(self) -> None:
        """Call immediately before the denoise loop."""
        self._synchronize()
        torch.cuda.reset_peak_memory_stats(self.device)

    @contextmanager
    def step(self) -> Iterator[None]:
        self._synchronize()
        started = time.perf_counter()
        yield
        self._synchronize()
        self.step_seconds.append(time.perf_counter() - started)

    def summary(self) -> dict[str, Any]:
        rest = self.step_seconds[1:]
        return {
            "label": self.label,
            "mode": self.mode,
            "steps": len(self.step_seconds),
            "first_step_ms": round(self.step_seconds[0] * 1000, 3) if self.step_seconds else None,
            "median_step_ms": round(statistics.median(rest) * 1000, 3) if rest else None,
            "peak_memory_bytes": self._peak_memory_bytes(),
        }

    def log(self) -> dict[str, Any]:
        summary = self.summary()
        logger.info(
            "%s %s: %d steps, first step %s ms, median of the rest %s ms, peak %.1f MiB",
            self.label,
            self.mode,
            summary["steps"],
            summary["first_step_ms"],
            summary["median_step_ms"],
            summary["peak_memory_bytes"] / 2**20,
        )
        return summary


def step_benchmark(device: torch.device | str, mode: str | None, label: str) -> StepBenchmark | None:
    """A StepBenchmark when a benchmarking mode is set and the device is CUDA; None otherwise (the default path
    never reaches the synchronizing timer)."""
    device = torch.device(device)
    if mode is None or device.type != "cuda":
        return None
    return StepBenchmark(device, mode, label)
