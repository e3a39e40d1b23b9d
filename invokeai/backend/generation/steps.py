"""What the denoise loops share: the per-step callback type, the seeded noise, and fresh scheduler copies.

The families' entry points run under torch.inference_mode() rather than the pipelines' no_grad: the same kernels and
the same pixels, without autograd's version and view bookkeeping on every op, which on the demo SD generation was
about 7% of its CPU time. What they return are inference tensors: use them under inference_mode or clone them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

# on_step(step, total, latents): `step` counts completed steps (1..total); `latents` are the current latents in the
# family's image layout. Raising from it (e.g. on cancel) ends the generation with that exception.
StepCallback = Callable[[int, int, torch.Tensor], None]


def seeded_generator(seed: int) -> torch.Generator:
    """The generator a pipeline gets from `torch.Generator("cpu").manual_seed(seed)`: noise is drawn on the CPU and
    moved, so one seed gives the same image on every device."""
    return torch.Generator("cpu").manual_seed(seed)


def seeded_noise(
    shape: tuple[int, ...], generator: torch.Generator, device: torch.device | str, dtype: torch.dtype
) -> torch.Tensor:
    """Gaussian noise exactly as the pipelines draw it (diffusers' randn_tensor, CPU generator)."""
    from diffusers.utils.torch_utils import randn_tensor

    return randn_tensor(shape, generator=generator, device=torch.device(device), dtype=dtype)


def fresh_scheduler(scheduler: Any) -> Any:
    """A copy of `scheduler` for one run: schedulers keep per-run state (step index, solver history), so the
    caller's instance is left untouched and two generations can share one. A copy, not `from_config`, which costs
    three times as much; what state a used one carries, `set_timesteps` resets, as it does in the pipelines."""
    return copy.deepcopy(scheduler)


@contextmanager
def upcast(module: Any, active: bool) -> Iterator[Any]:
    """The module in float32 while the block runs, back in its own dtype after, as the diffusers pipelines upcast a
    VAE (in place: the float32 weights replace the 16-bit ones for that time). Inactive, or already float32: no-op."""
    dtype = module.dtype
    active = active and dtype != torch.float32
    if active:
        module.to(dtype=torch.float32)
    try:
        yield module
    finally:
        if active:
            module.to(dtype=dtype)
