"""Fixtures for the attention tests: a clean process state per test, and the CPU as a stand-in GPU.

PyTorch's CPU backend ignores the kernel order and has neither cuDNN nor memory-efficient attention, so tests that
exercise reports, demotion or sage inject the two things a GPU would supply: which tensors count as on a reported
device, and the dispatcher's answers. The stand-in dispatcher answers the way CUDA's does: it walks PyTorch's real
priority order and flags (as installed by the code under test) and returns the first enabled kernel it was told
can serve the call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from invokeai.backend.attention import devices, uninstall_attention
from invokeai.backend.attention.torch_flags import apply_flags, read_flags


@pytest.fixture(autouse=True)
def clean_attention() -> Iterator[None]:
    original = F.scaled_dot_product_attention
    flags = read_flags()
    yield
    uninstall_attention()
    F.scaled_dot_product_attention = original
    apply_flags(flags)


@pytest.fixture
def stand_in_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors are treated as CUDA tensors by the report, the cuDNN fallback and sage."""
    monkeypatch.setattr(devices, "is_reported_tensor", lambda tensor: True)
    monkeypatch.setattr(devices, "has_reported_device", lambda: True)
    monkeypatch.setattr(devices, "has_cuda", lambda: True)
    monkeypatch.setattr(devices, "is_sage_tensor", lambda tensor: True)


class StandInDispatcher:
    """`torch._fused_sdp_choice` as CUDA would answer it, for a device whose kernels can serve only `can_serve`."""

    def __init__(self, can_serve: set[str]) -> None:
        self.can_serve = can_serve
        self.calls = 0

    def __call__(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
    ) -> int:  # type: ignore[no-untyped-def]
        self.calls += 1
        flags = read_flags()
        for value_ in flags.order:
            kernel = SDPBackend(value_)
            if kernel in flags.enabled and kernel.name in self.can_serve:
                return value_
        raise RuntimeError("No available kernel. Aborting execution.")


@pytest.fixture
def dispatcher(monkeypatch: pytest.MonkeyPatch) -> Callable[..., StandInDispatcher]:
    def make(*can_serve: str) -> StandInDispatcher:
        stand_in = StandInDispatcher(set(can_serve))
        monkeypatch.setattr(devices, "fused_sdp_choice", stand_in)
        return stand_in

    return make


def _qkv(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=generator).to(dtype) for _ in range(3))


@pytest.fixture
def qkv() -> Callable[..., tuple[torch.Tensor, ...]]:
    """Seeded query, key and value tensors of one shape."""
    return _qkv
