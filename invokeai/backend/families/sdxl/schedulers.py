"""SDXL's samplers, built on the model's own noise schedule (its scheduler_config.json).

A stand-in until the SD families' shared scheduler table lands: each name maps to the diffusers class and options
InvokeAI uses for it, built with `new_scheduler` (diffusers' from_config on the model's config).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from invokeai.backend.models.schedulers import new_scheduler

# name -> (diffusers class name, options)
_SCHEDULERS: dict[str, tuple[str, dict[str, Any]]] = {
    "euler": ("EulerDiscreteScheduler", {}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "euler_k": ("EulerDiscreteScheduler", {"use_karras_sigmas": True}),
    "ddim": ("DDIMScheduler", {}),
    "dpmpp_2m": ("DPMSolverMultistepScheduler", {"solver_order": 2}),
    "dpmpp_2m_k": ("DPMSolverMultistepScheduler", {"solver_order": 2, "use_karras_sigmas": True}),
}
SCHEDULER_NAMES = tuple(_SCHEDULERS)


def make_scheduler(name: str, base_config: Mapping[str, Any]) -> Any:
    import diffusers

    try:
        cls, options = _SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(SCHEDULER_NAMES)}") from None
    return new_scheduler(getattr(diffusers, cls), dict(base_config), **options)
