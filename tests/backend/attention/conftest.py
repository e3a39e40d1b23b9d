"""Fixtures for the attention tests: a clean process state per test, and the CPU as a stand-in GPU.

PyTorch's CPU backend ignores the kernel order and has neither cuDNN nor memory-efficient attention, so tests that
exercise reports, demotion or sage inject the two things a GPU would supply, through the seams of
`invokeai.backend.devices`: which tensors count as on a reported device, and the dispatcher's answers
(`invokeai.backend.attention.testing.StandInDispatcher`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from invokeai.backend import devices
from invokeai.backend.attention.testing import pristine_attention


@pytest.fixture(autouse=True)
def clean_attention() -> Iterator[None]:
    with pristine_attention():
        yield


@pytest.fixture
def stand_in_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors are treated as CUDA tensors by the report, the cuDNN fallback and sage."""
    monkeypatch.setattr(devices, "is_reported_tensor", lambda tensor: True)
    monkeypatch.setattr(devices, "has_reported_device", lambda: True)
    monkeypatch.setattr(devices, "has_cuda", lambda: True)
    monkeypatch.setattr(devices, "is_sage_tensor", lambda tensor: True)
    monkeypatch.setattr(devices, "is_sage_device", lambda device: True)


def _qkv(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=generator).to(dtype) for _ in range(3))


@pytest.fixture
def qkv() -> Callable[..., tuple[torch.Tensor, ...]]:
    """Seeded query, key and value tensors of one shape."""
    return _qkv
