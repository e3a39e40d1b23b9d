"""Per-step timing of a denoise loop, built only when INVOKE_KREA2_SDPA_BACKEND is set and the device is CUDA.

Each step is bracketed by `torch.cuda.synchronize()`, which serialises the loop: the default path must never reach
it, hence the factory returns None unless asked. The peak-memory counter is reset right before the loop so the
figure is the loop's, not the model load's; the first step is reported apart because it absorbs kernel selection
and allocator warm-up.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from invokeai.backend.attention.state import WINDOW_ENV
from invokeai.backend.attention.window import window_mode_from_env

logger = logging.getLogger(__name__)


class StepBenchmark:
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
            "%s %s=%s: %d steps, first step %s ms, median of the rest %s ms, peak %.1f MiB",
            self.label,
            WINDOW_ENV,
            self.mode,
            summary["steps"],
            summary["first_step_ms"],
            summary["median_step_ms"],
            summary["peak_memory_bytes"] / 2**20,
        )
        return summary


def step_benchmark(device: torch.device | str, label: str = "krea2_denoise") -> StepBenchmark | None:
    mode = window_mode_from_env()
    device = torch.device(device)
    if mode is None or device.type != "cuda":
        return None
    return StepBenchmark(device, mode, label)
