"""Test support for code that depends on the attention policy, usable on a CPU-only machine.

PyTorch's CPU backend ignores the kernel order and has neither cuDNN nor memory-efficient attention, so a test
that needs "what a GPU's dispatcher would say" replaces `devices.fused_sdp_choice` with a `StandInDispatcher`:
it walks PyTorch's real priority order and flags, as the code under test installed them, and answers with the first
enabled kernel it was told can serve the call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from invokeai.backend.attention.install import uninstall_attention
from invokeai.backend.attention.torch_flags import apply_flags, read_flags


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


@contextmanager
def pristine_attention() -> Iterator[None]:
    """Undo whatever the block installs: the policy, the SDPA function object, PyTorch's flags and order."""
    original = F.scaled_dot_product_attention
    flags = read_flags()
    try:
        yield
    finally:
        uninstall_attention()
        F.scaled_dot_product_attention = original
        apply_flags(flags)
