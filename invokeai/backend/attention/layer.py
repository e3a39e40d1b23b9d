"""What an optional layer of the patched SDPA declares, once, beside its constraints.

Each layer (the cuDNN fallback, the report, the cuDNN and ROCm guards, SageAttention) is one module that owns its
condition, its call layer, its route (calls it takes before PyTorch's order, or a dispatcher's choice it replaces),
its failure hook, its report reason and its pricing rule, as diffusers declares each attention backend beside its
constraints. `install` composes the layers whose condition holds, in `install.LAYERS` order; the router asks their
routes in the same order; the report asks their reasons; `sdpa_score_matrix_bytes` composes their pricing rules like
the calls.

Layers share one internal call signature, (route, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa), so
the route is computed once per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from invokeai.backend.attention.memory import PricedCall
    from invokeai.backend.attention.state import AttentionState

Route = Any  # a PyTorch kernel's name ("FLASH_ATTENTION", ...), "ERROR", or a layer's own route (sage, guarded math)
Call = Callable[..., torch.Tensor]  # (route, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
Claim = Callable[..., Route | None]  # (q, k, v, attn_mask, dropout_p, is_causal, enable_gqa) -> a route or None
# (dispatcher's route, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> a route instead, or None
Reroute = Callable[..., Route | None]
Rebuild = Callable[[], Callable[..., torch.Tensor]]  # re-composes the layers; returns the new public function


class Layer:
    """The defaults: a layer that adds nothing. Subclasses override what they own."""

    name: str = ""

    def active(self, state: AttentionState) -> bool:
        """Whether this process composes the layer (checked at install and at every rebuild)."""
        raise NotImplementedError

    def wrap(self, state: AttentionState, inner: Call, rebuild: Rebuild) -> Call:
        """The call layer around `inner`."""
        return inner

    def claim(self, state: AttentionState) -> Claim | None:
        """A predicate for the calls this layer serves itself, asked after PyTorch's dispatcher has accepted the
        call's arguments; None when it serves none."""
        return None

    def reroute(self, state: AttentionState) -> Reroute | None:
        """A replacement for the dispatcher's own choice, asked with it for the calls no claim took (a guard that
        keeps some calls from a kernel); None when it replaces none."""
        return None

    def reason(self, state: AttentionState, pinned: str, route: Route) -> tuple[str, str] | None:
        """(reason, explanation) when this layer is why the pinned kernel did not serve a call that ran on `route`."""
        return None

    def price(self, state: AttentionState, call: PricedCall, inner: Callable[[], int]) -> int:
        """Bytes one such call materialises, given what the layers inside would say (`inner()`)."""
        return inner()


def is_out_of_memory(error: BaseException) -> bool:
    """A layer's failure that is memory, not a defect of its kernel, so no fallback applies. PyTorch raises
    torch.OutOfMemoryError, but some paths (cuDNN's workspace, other allocators) raise a plain RuntimeError that
    says so."""
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
