"""Krea-2's one sampler: flow-matching Euler on the model's own (dynamically shifted) schedule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from invokeai.backend.families.krea2.constants import NAME

SCHEDULER_NAMES = ("euler",)


def make_scheduler(name: str, base_config: Mapping[str, Any]) -> Any:
    """Krea-2 samples with flow-matching Euler and the resolution-dependent (dynamic) shift of its config."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from invokeai.backend.models.schedulers import new_scheduler

    if name not in SCHEDULER_NAMES:
        raise ValueError(f"unknown scheduler {name!r} for {NAME}; known: euler")
    return new_scheduler(FlowMatchEulerDiscreteScheduler, dict(base_config))
