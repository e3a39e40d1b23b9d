"""Full-size diffusers models with random weights, made straight on the device they run on: parameters are created
on the meta device and materialised with `to_empty`, then filled with random values there (the values do not
change the work; nothing is initialised on the CPU, so a 12 B-parameter transformer takes seconds, not minutes).
benchmarks/krea2_steps.py and benchmarks/model_steps.py import this as `_random_models`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_random(
    cls: Any, config: dict[str, Any], device: torch.device, dtype: torch.dtype, *, norm_weight: float = 1.0
) -> torch.nn.Module:
    """`cls(**config)` in `dtype` on `device`, weights drawn from N(0, 0.02) with a fixed seed. One-dimensional
    norm weights are set to `norm_weight` (1: a norm's identity scale; 0 for zero-centred scales such as Krea-2's)
    and their biases to 0, so activations keep a sane size through many blocks. Modules the class keeps in float32
    (`_keep_in_fp32_modules`) stay float32, as diffusers loads them. Buffers are left as `to_empty` makes them
    (uninitialised): the models built here compute none at construction that their forward pass reads."""
    with default_dtype(dtype), torch.device("meta"):
        model = cls(**config)
    model = model.to_empty(device=device)
    generator = torch.Generator(device).manual_seed(0)
    keep_fp32 = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in keep_fp32:
                module.float()
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1 and "norm" in name:
                parameter.fill_(norm_weight if name.endswith("weight") else 0.0)
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
    return model.eval().requires_grad_(False)
