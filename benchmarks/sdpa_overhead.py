"""Per-call cost of the installed SDPA wrapper, against the floor of exact counting and against diffusers' dispatch.

Counting every call under the kernel that serves it needs PyTorch's dispatcher answer for every call, so that
query (`torch._fused_sdp_choice`) is the floor, and the budget is relative to it (docs/attention.md, "Cost"):

- `auto` adds at most 2.5 times the floor, a pinned kernel on the report path at most 3 times;
- each adds at most 0.15 times what diffusers' `dispatch_attention_fn` adds over bare SDPA on the same call in its
  own (batch, sequence, heads, head_dim) layout: the peer a user would otherwise call.

All figures come from one run on one tiny call ([1, 2, 8, 8] fp32 on the CPU, so SDPA's own time is small), rounds
interleaved so machine noise hits every row alike, minimum per call over rounds:
- isolated: the wrapper around a do-nothing stand-in for SDPA, against the stand-in itself, which removes SDPA's
  own run-to-run noise (about +-1 us here) from the difference. The ratios are computed from these.
- end to end: the wrapper around the real SDPA against the bare call, for reference.
On a CPU-only machine CPU tensors are not reported, so the pinned row makes the CPU a stand-in reported device:
every call then takes the report path (pinned efficient, served by flash). Without diffusers (the GPU machine) the
comparison with it is skipped, not failed.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import invokeai.backend.attention as attention
from invokeai.backend import devices

BARE = F.scaled_dot_product_attention
AUTO = "auto"
PINNED = "pinned efficient, report path"
TARGETS = {AUTO: 2.5, PINNED: 3.0}
PEER_TARGET = 0.15


def _nothing(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):  # type: ignore[no-untyped-def]
    return query


def _per_call_us(function: Callable[..., object], args: tuple[torch.Tensor, ...], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        function(*args)
    return (time.perf_counter() - started) / calls * 1e6


_reported = devices.is_reported_tensor
_has_reported = devices.has_reported_device


def _installed(setting: str, original: Callable[..., torch.Tensor], stand_in: bool) -> Callable[..., torch.Tensor]:
    attention.uninstall_attention()
    F.scaled_dot_product_attention = original
    devices.is_reported_tensor = (lambda tensor: True) if stand_in else _reported  # type: ignore[assignment]
    devices.has_reported_device = (lambda: True) if stand_in else _has_reported  # type: ignore[assignment]
    attention.install_attention(setting)
    return F.scaled_dot_product_attention


def _diffusers_dispatch() -> Callable[..., torch.Tensor] | None:
    try:
        from diffusers.models.attention_dispatch import dispatch_attention_fn
    except ImportError:
        return None
    return dispatch_attention_fn


def verdict(ratio: float, target: float) -> str:
    return "PASS" if ratio <= target else "FAIL"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # the stand-in row reports once per install
    q = torch.randn(1, 2, 8, 8)
    layout = q.permute(0, 2, 1, 3).contiguous()  # diffusers' (batch, sequence, heads, head_dim)
    dispatch = _diffusers_dispatch()
    rows = {AUTO: ("auto", False), PINNED: ("efficient", True)}
    best: dict[object, float] = {}

    def keep(key: object, value: float) -> None:
        best[key] = min(best.get(key, float("inf")), value)

    for _ in range(args.rounds):
        keep("floor", _per_call_us(torch._fused_sdp_choice, (q, q, q), args.calls))
        if dispatch is not None:
            F.scaled_dot_product_attention = BARE
            keep("diffusers", _per_call_us(dispatch, (layout, layout, layout), args.calls))
        for kind, original in (("end to end", BARE), ("isolated", _nothing)):
            keep((kind, "bare"), _per_call_us(original, (q, q, q), args.calls))
            for row, (setting, stand_in) in rows.items():
                wrapped = _installed(setting, original, stand_in)
                keep((kind, row), _per_call_us(wrapped, (q, q, q), args.calls))
    attention.uninstall_attention()
    F.scaled_dot_product_attention = BARE
    devices.is_reported_tensor, devices.has_reported_device = _reported, _has_reported  # type: ignore[assignment]

    floor = best["floor"]
    print(f"torch {torch.__version__}, call [1, 2, 8, 8] float32 on cpu, {args.rounds} rounds x {args.calls} calls")
    print(f"floor: PyTorch's dispatcher query alone (torch._fused_sdp_choice): {floor:.3f} us per call")
    bare = best[("end to end", "bare")]
    print(f"bare SDPA: {bare:.3f} us per call")
    peer = None
    if dispatch is None:
        print("diffusers' dispatch_attention_fn: diffusers does not import here; its comparison is skipped")
    else:
        peer = best["diffusers"] - bare
        print(
            f"diffusers' dispatch_attention_fn (native backend, its own layout): {best['diffusers']:.3f} us per "
            f"call, adds {peer:.3f} us over bare SDPA"
        )
    for kind in ("end to end", "isolated"):
        base = best[(kind, "bare")]
        for row in rows:
            print(f"{kind:10s} {row}: {best[(kind, row)]:.3f} us per call, adds {best[(kind, row)] - base:.3f} us")
    print()
    for row, target in TARGETS.items():
        added = best[("isolated", row)] - best[("isolated", "bare")]
        ratio = added / floor
        print(f"{row}: adds {added:.3f} us = {ratio:.2f} x the floor (target <= {target}): {verdict(ratio, target)}")
        if peer is not None:
            share = added / peer
            print(
                f"{row}: adds {share:.3f} x what diffusers adds (target <= {PEER_TARGET}): "
                f"{verdict(share, PEER_TARGET)}"
            )


if __name__ == "__main__":
    main()
