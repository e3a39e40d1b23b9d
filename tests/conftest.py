"""Fixtures shared across test folders. torch is imported inside them, so tests that need none of it (the
configuration and API tests) do not pay for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from invokeai.backend.attention.testing import StandInDispatcher


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from threads, and on a shared 2-core machine OpenMP workers spin-waiting for a busy
    core made a 0.3 s generation take 10 s; one thread keeps these tests' time steady."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def dispatcher(monkeypatch: pytest.MonkeyPatch) -> Callable[..., StandInDispatcher]:
    """`dispatcher("FLASH_ATTENTION", ...)`: PyTorch's dispatcher replaced by one that serves only those kernels,
    walking the installed order and flags as a GPU's would; `dispatcher({"FLASH_ATTENTION": rule, ...})` gives a
    kernel a rule over the call (e.g. flash takes no mask)."""
    from invokeai.backend import devices
    from invokeai.backend.attention.testing import StandInDispatcher

    def make(*can_serve: Any) -> StandInDispatcher:
        rules = can_serve[0] if len(can_serve) == 1 and isinstance(can_serve[0], dict) else can_serve
        stand_in = StandInDispatcher(rules)
        monkeypatch.setattr(devices, "fused_sdp_choice", stand_in)
        return stand_in

    return make
