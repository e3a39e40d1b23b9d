"""One forward pass of each (family, operation) with seeded inputs shaped by `CallFacts`, called the way the
family's diffusers pipeline calls it; each family declares its runs (`Family.runs`) beside its estimators, built on
`invokeai.backend.cache.run_inputs`. The calibration script measures these runs against the estimators, and the
tests record their SDPA calls against the calls the estimators list, so both check the estimate against the real
code. This module reads the registry: no family imports it.
"""

from __future__ import annotations

from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts
from invokeai.backend.cache.run_inputs import Run
from invokeai.backend.families.registry import get_family


def component_run(family: str, operation: str, model: Any, facts: CallFacts, seed: int = 0) -> Run:
    """A no-argument function running one forward pass; inputs are built now, so calling it allocates only what
    the forward pass itself does. Call it under torch.inference_mode()."""
    runs = get_family(family).runs
    if operation not in runs:
        raise KeyError(f"the {family} family has no run for {operation!r}; it has {', '.join(sorted(runs))}")
    return runs[operation](model, facts, torch.Generator().manual_seed(seed))
