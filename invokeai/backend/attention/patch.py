"""The function that replaces `torch.nn.functional.scaled_dot_product_attention`, and its innermost layer.

It keeps SDPA's contract: the signature, the defaults, PyTorch's own argument checks and errors, and the override
protocol (`__torch_function__`), so masks from `torch.nn.attention.bias` and TorchFunctionModes (diffusers'
layer skip) see one SDPA call and act on it. Under torch.compile and torch.export it is PyTorch's SDPA itself, so
compiled graphs keep it in one piece (no graph break) and dispatch it under the installed flags and order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch.overrides import handle_torch_function, has_torch_function_variadic

from invokeai.backend import devices
from invokeai.backend.attention.caller import current_tally
from invokeai.backend.attention.layer import Call
from invokeai.backend.attention.routing import BACKEND_BY_VALUE, ERROR, Router, route_adjuster
from invokeai.backend.attention.state import AttentionState


def sdpa_call(original: Callable[..., torch.Tensor]) -> Call:
    """The innermost layer: PyTorch's SDPA with the arguments the caller gave, then the count."""
    tally = current_tally
    counter = itertools.count

    def sdpa(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
        # Parsing explicit defaults costs the C binding ~0.3 us, so a call that left them out passes only the
        # tensors; identity checks, so that any other value (is_causal=0, dropout_p=None) meets PyTorch's checks.
        # A call the dispatcher refused passes its arguments by keyword, as callers pass these flags, so that
        # PyTorch's argument errors read word for word as without the patch.
        if s is None and g is False:
            if m is None and c is False and d.__class__ is float and not d:
                out = original(q, k, v)
            elif route is ERROR:
                out = original(q, k, v, attn_mask=m, dropout_p=d, is_causal=c)
            else:
                out = original(q, k, v, m, d, c)
        else:
            out = original(q, k, v, attn_mask=m, dropout_p=d, is_causal=c, scale=s, enable_gqa=g)
        # stats.count, inlined: this is the hottest line of the server.
        calls = tally()
        next(calls.get(route) or calls.setdefault(route, counter()))
        return out

    return sdpa


def public_function(
    state: AttentionState, router: Router, chain: Call, original: Callable[..., torch.Tensor]
) -> Callable[..., torch.Tensor]:
    """A function with SDPA's exact signature (scale and enable_gqa are keyword-only, as in PyTorch).

    Every call asks PyTorch's dispatcher which kernel serves it. Outside a benchmarking window that question is
    asked here, inline, rather than through `router` (which asks it the same way): the Python frame a call costs is
    a tenth of the wrapper's whole budget (docs/attention.md, "Cost"). The layers' claims and reroutes follow, where
    any layer has them."""
    lock = state.lock
    # torch.compiler.is_compiling(), without its two Python calls: Dynamo (torch.compile, strict torch.export)
    # folds is_dynamo_compiling() to True while it traces, and non-strict torch.export sets the flag.
    dynamo_compiling = torch.compiler.is_dynamo_compiling
    compiler = torch.compiler
    choice = devices.fused_sdp_choice
    by_value = BACKEND_BY_VALUE
    adjust = route_adjuster(state)

    def scaled_dot_product_attention(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
    ):  # type: ignore[no-untyped-def]
        if has_torch_function_variadic(query, key, value, attn_mask):
            # A tensor subclass (CausalBias) or a TorchFunctionMode takes the call, as it would from PyTorch's SDPA;
            # whatever it calls back comes through here again, with the override handled.
            return handle_torch_function(
                scaled_dot_product_attention,
                (query, key, value, attn_mask),
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        if dynamo_compiling() or compiler._is_compiling_flag:
            # Dynamo sees only this branch: one SDPA op in the graph, dispatched by PyTorch under the installed
            # flags and order when the graph runs. Nothing in it is counted or reported.
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if state.serialize:
            # A window is open: the route is asked and the call run under its lock, so its flags hold for both.
            with lock:
                return chain(
                    router(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa),
                    query,
                    key,
                    value,
                    attn_mask,
                    dropout_p,
                    is_causal,
                    scale,
                    enable_gqa,
                )
        # The router's dispatcher question, inline (routing.make_router says why each form).
        try:
            if scale is None and enable_gqa is False:
                if attn_mask is None and is_causal is False and dropout_p.__class__ is float and not dropout_p:
                    route = by_value[choice(query, key, value)]
                else:
                    route = by_value[choice(query, key, value, attn_mask, dropout_p, is_causal)]
            else:
                route = by_value[
                    choice(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
                ]
        except Exception:
            route = ERROR
        else:
            if adjust is not None:
                route = adjust(route, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        return chain(route, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    scaled_dot_product_attention.__doc__ = original.__doc__
    # Python names the qualified name in argument errors; keep them reading like PyTorch's.
    scaled_dot_product_attention.__qualname__ = "scaled_dot_product_attention"
    return scaled_dot_product_attention
