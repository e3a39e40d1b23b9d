"""Which kernel serves a call under the installed policy: PyTorch's dispatcher, then the layers' own routes (claims,
then reroutes of the dispatcher's choice).

The patch, `serving_kernel` and the memory pricing all ask the router built here, with every argument of the call,
so what is counted, reported and priced is what runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend import devices
from invokeai.backend.attention.layer import Route
from invokeai.backend.attention.state import STATE, AttentionState

ERROR = "ERROR"

# Routes are the backends' names: pybind enums hash and compare through Python (~0.3 us each), plain strings do
# not, and every call hashes its route once. Interned, so they are the very objects the literals "MATH", "ERROR"...
# are. Indexed by the SDPBackend value; ERROR (-1) is the last entry.
BACKEND_BY_VALUE: tuple[str, ...] = tuple(
    sys.intern(SDPBackend(value).name) for value in (*range(int(SDPBackend.OVERRIDEABLE) + 1), int(SDPBackend.ERROR))
)

Router = Callable[..., Route]  # (q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> route


def make_router(state: AttentionState) -> Router:
    """The router for the state's layers, with only the checks they need.

    PyTorch's dispatcher is asked first, on every call, with the call's own arguments: it also checks them, so a
    call it refuses routes to ERROR and the real call raises PyTorch's own error. A cache would cost more than the
    query (~0.4-0.9 us here): its key (three shapes, dtype, device, the flags) takes longer to read from Python.
    """
    choice = devices.fused_sdp_choice
    by_value = BACKEND_BY_VALUE

    def dispatcher_route(q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        try:
            # Explicit defaults cost the C binding ~0.3 us to parse, so a call that left them out passes only the
            # tensors. Identity checks, so that any other value (is_causal=0, dropout_p=None) reaches PyTorch's own
            # argument checks.
            if s is None and g is False:
                if m is None and c is False and d.__class__ is float and not d:
                    return by_value[choice(q, k, v)]
                return by_value[choice(q, k, v, m, d, c)]
            return by_value[choice(q, k, v, m, d, c, scale=s, enable_gqa=g)]
        except Exception:
            # Bad arguments or no eligible kernel: the real call raises PyTorch's own error, unchanged.
            return ERROR

    adjust = route_adjuster(state)
    if adjust is None:
        return dispatcher_route

    def route(q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        chosen = dispatcher_route(q, k, v, m, d, c, s, g)
        return chosen if chosen == ERROR else adjust(chosen, q, k, v, m, d, c, s, g)

    return route


def route_adjuster(state: AttentionState) -> Callable[..., Route] | None:
    """The layers' say over a call PyTorch's dispatcher accepted: (its choice, the call) -> the route, asking the
    claims, then the reroutes; None when no composed layer has either (the route is the dispatcher's)."""
    claims = [claim for layer in state.layers if (claim := layer.claim(state)) is not None]
    reroutes = [reroute for layer in state.layers if (reroute := layer.reroute(state)) is not None]
    if not claims and not reroutes:
        return None

    def adjust(chosen, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        for claim in claims:
            claimed = claim(q, k, v, m, d, c, g)
            if claimed is not None:
                return claimed
        for reroute in reroutes:
            instead = reroute(chosen, q, k, v, m, d, c, s, g)
            if instead is not None:
                return instead
        return chosen

    return adjust


def public_kernel(route: Route) -> SDPBackend | str:
    """What `serving_kernel` answers: a PyTorch backend, or a layer's own kernel by name ("sage")."""
    kernel = getattr(SDPBackend, str(route), None)
    return kernel if kernel is not None else str(route)


def serving_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> SDPBackend | str:
    """Which kernel would serve this exact call under the installed policy: an SDPBackend (ERROR when none can),
    or "sage"."""
    router = STATE.router if STATE.router is not None else make_router(STATE)
    return public_kernel(router(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa))


def describe_call(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
) -> str:
    """What a kernel's eligibility turns on: "bfloat16, head_dim 128, no mask, 32 query / 8 key-value heads"."""
    parts = [str(query.dtype).removeprefix("torch."), f"head_dim {query.shape[-1]}"]
    if attn_mask is None:
        parts.append("no mask")
    elif attn_mask.dtype == torch.bool:
        parts.append("bool mask")
    else:
        parts.append(f"additive {str(attn_mask.dtype).removeprefix('torch.')} mask")
    if query.dim() == 4:
        q_heads, kv_heads = query.shape[1], key.shape[1]
        parts.append(f"{q_heads} heads" if q_heads == kv_heads else f"{q_heads} query / {kv_heads} key-value heads")
        parts.append(f"query length {query.shape[2]}, key length {key.shape[2]}")
    else:
        parts.append(f"{query.dim()}-D input")
    if enable_gqa:
        parts.append("enable_gqa")
    if is_causal:
        parts.append("causal")
    if dropout_p:
        parts.append(f"dropout {dropout_p}")
    return ", ".join(parts)


def route_name(route: Any) -> str:
    """The kernel a route runs on, by name: a layer's own route names its kernel (guarded math is "MATH")."""
    return str(route)
