"""What every family's calibration runs (`invokeai/backend/families/<family>/runs.py`) share: the type of a run and
the seeded inputs they build. `invokeai.backend.cache.component_runs`, which looks a family's runs up in the
registry, is imported by none of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts

Run = Callable[[], Any]
RunBuilder = Callable[[Any, CallFacts, torch.Generator], Run]


def randn(generator: torch.Generator, facts: CallFacts, *shape: int) -> torch.Tensor:
    # Drawn on the CPU (one generator for every device), then moved: the baseline holds only the final inputs.
    return torch.randn(shape, generator=generator).to(facts.device, facts.dtype)


def token_ids(generator: torch.Generator, facts: CallFacts, vocab_size: int, batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, length), generator=generator).to(facts.device)
