"""Test support for code that depends on the attention policy, usable on a CPU-only machine.

PyTorch's CPU backend ignores the kernel order and has neither cuDNN nor memory-efficient attention, so a test
that needs "what a GPU's dispatcher would say" replaces `invokeai.backend.devices.fused_sdp_choice` (and
`kernel_can_serve`, one kernel's eligibility) with a `StandInDispatcher`: it walks PyTorch's real priority order
and flags, as the code under test installed them, and answers with the first enabled kernel that can serve the
call, by the rules it was given (a kernel name for "any call", or a predicate over the call's arguments, which is
how a test states a GPU rule such as "flash takes no mask"). Where the CPU's own dispatcher can answer, tests ask
it too.

Like PyTorch's query, the stand-in refuses arguments of the wrong type (`is_causal=0`, `dropout_p=None`), so that
the patch routes such a call to ERROR and the real call raises PyTorch's own TypeError, as it does on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Real

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from invokeai.backend.attention.install import uninstall_attention
from invokeai.backend.attention.policy import apply_flags, read_flags


@dataclass(frozen=True)
class DispatchedCall:
    """The arguments a dispatcher query was asked with."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool


Rule = Callable[[DispatchedCall], bool]


def any_call(call: DispatchedCall) -> bool:
    return True


# A recent NVIDIA GPU's limits where they differ by kernel: flash takes no mask, the memory-efficient kernel no
# grouped-query call (enable_gqa), cuDNN and math take both. So one call can need cuDNN, and its retry math.
GPU_RULES: dict[str, Rule] = {
    "CUDNN_ATTENTION": any_call,
    "EFFICIENT_ATTENTION": lambda call: not call.enable_gqa,
    "FLASH_ATTENTION": lambda call: call.attn_mask is None,
    "MATH": any_call,
}


def _check_arguments(dropout_p: object, is_causal: object, scale: object, enable_gqa: object) -> None:
    """PyTorch's binding takes only a bool for a bool argument, and a number (or a one-element tensor) for a float."""
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if flag.__class__ is not bool:
            raise TypeError(f"_fused_sdp_choice(): argument '{name}' must be bool, not {type(flag).__name__}")
    for name, number in (("dropout_p", dropout_p), ("scale", scale)):
        if name == "scale" and number is None:
            continue
        if isinstance(number, Real) or (isinstance(number, torch.Tensor) and number.numel() == 1):
            continue
        raise TypeError(f"_fused_sdp_choice(): argument '{name}' must be float, not {type(number).__name__}")


class StandInDispatcher:
    """`torch._fused_sdp_choice` as CUDA would answer it, for a device whose kernels serve what `can_serve` says:
    an iterable of kernel names (each serves any call) or a mapping of kernel name to a rule over the call."""

    def __init__(self, can_serve: Iterable[str] | Mapping[str, Rule]) -> None:
        self.rules: dict[str, Rule] = (
            dict(can_serve) if isinstance(can_serve, Mapping) else {name: (lambda call: True) for name in can_serve}
        )
        self.calls = 0
        self.last: DispatchedCall | None = None

    def __call__(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
    ) -> int:  # type: ignore[no-untyped-def]
        call = DispatchedCall(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        self.calls += 1
        self.last = call
        _check_arguments(dropout_p, is_causal, scale, enable_gqa)
        flags = read_flags()
        for value_ in flags.order:
            kernel = SDPBackend(value_)
            rule = self.rules.get(kernel.name)
            if kernel in flags.enabled and rule is not None and rule(call):
                return value_
        raise RuntimeError("No available kernel. Aborting execution.")

    def can_serve(self, kernel, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:  # type: ignore[no-untyped-def]
        """`devices.kernel_can_serve` as this device would answer it: the kernel is enabled and its rule holds."""
        rule = self.rules.get(kernel)
        call = DispatchedCall(query, key, value, attn_mask, dropout_p, is_causal, None, enable_gqa)
        return rule is not None and getattr(SDPBackend, kernel) in read_flags().enabled and rule(call)


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
