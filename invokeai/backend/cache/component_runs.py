"""One forward pass of each (family, operation) with seeded inputs shaped by `CallFacts`, called the way the
family's diffusers pipeline calls it; each family declares its runs (`Family.runs`) beside its estimators. The
calibration script measures these runs against the estimators, and the tests record their SDPA calls against the
calls the estimators list, so both check the estimate against the real code.
"""

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


def component_run(family: str, operation: str, model: Any, facts: CallFacts, seed: int = 0) -> Run:
    """A no-argument function running one forward pass; inputs are built now, so calling it allocates only what
    the forward pass itself does. Call it under torch.inference_mode()."""
    from invokeai.backend.families import get_family

    runs = get_family(family).runs
    if operation not in runs:
        raise KeyError(f"the {family} family has no run for {operation!r}; it has {', '.join(sorted(runs))}")
    return runs[operation](model, facts, torch.Generator().manual_seed(seed))
