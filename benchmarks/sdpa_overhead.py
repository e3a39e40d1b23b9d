"""Per-call cost of the installed SDPA wrapper over bare `scaled_dot_product_attention`, measured in one run.

Budget (docs/attention.md): auto adds at most 0.5 us per call over bare SDPA; a pinned kernel with reporting at
most 1.5 us. On a CPU-only machine CPU tensors are not reported, so the pinned row uses the CPU as a stand-in
reported device: every call then takes the "pinned kernel not possible" path (pinned efficient, served by flash).

Two measurements per setting, rounds interleaved so machine noise hits all rows alike, minimum over rounds:
- end to end: the wrapper around the real SDPA on a tiny call, against the bare call;
- isolated: the wrapper around a do-nothing stand-in for SDPA, against the stand-in itself, which removes
  SDPA's own run-to-run noise (about +-1 us here) from the difference.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import invokeai.backend.attention as attention
from invokeai.backend.attention import devices

BARE = F.scaled_dot_product_attention


def _nothing(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):  # type: ignore[no-untyped-def]
    return query


def _per_call_us(function: Callable[..., torch.Tensor], q: torch.Tensor, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        function(q, q, q)
    return (time.perf_counter() - started) / calls * 1e6


def _installed(setting: str, original: Callable[..., torch.Tensor], stand_in: bool) -> Callable[..., torch.Tensor]:
    attention.uninstall_attention()
    F.scaled_dot_product_attention = original
    devices.is_reported_tensor = (lambda tensor: True) if stand_in else _reported  # type: ignore[assignment]
    devices.has_reported_device = (lambda: True) if stand_in else _has_reported  # type: ignore[assignment]
    attention.install_attention(setting)
    return F.scaled_dot_product_attention


_reported = devices.is_reported_tensor
_has_reported = devices.has_reported_device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # the stand-in row reports once per install
    q = torch.randn(1, 2, 8, 8)
    rows = {"auto": ("auto", False), "pinned efficient, reported": ("efficient", True)}
    best: dict = {}
    for _ in range(args.rounds):
        best["dispatcher query"] = min(
            best.get("dispatcher query", 1e9), _per_call_us(torch._fused_sdp_choice, q, args.calls)
        )
        for kind, original in (("end to end", BARE), ("isolated", _nothing)):
            best[(kind, "bare")] = min(best.get((kind, "bare"), 1e9), _per_call_us(original, q, args.calls))
            for row, (setting, stand_in) in rows.items():
                wrapped = _installed(setting, original, stand_in)
                best[(kind, row)] = min(best.get((kind, row), 1e9), _per_call_us(wrapped, q, args.calls))
    attention.uninstall_attention()
    F.scaled_dot_product_attention = BARE
    print(f"torch {torch.__version__}, call [1, 2, 8, 8] float32 on cpu, {args.rounds} rounds x {args.calls} calls")
    budgets = {"auto": 0.5, "pinned efficient, reported": 1.5}
    print(
        f"PyTorch's dispatcher query alone (torch._fused_sdp_choice, which every counted call asks): "
        f"{best['dispatcher query']:.3f} us per call"
    )
    for kind in ("end to end", "isolated"):
        bare = best[(kind, "bare")]
        print(f"{kind:10s} bare: {bare:.3f} us per call")
        for row in rows:
            added = best[(kind, row)] - bare
            print(
                f"{kind:10s} {row}: {best[(kind, row)]:.3f} us per call, adds {added:.3f} us "
                f"(ratio {best[(kind, row)] / bare:.3f}; budget {budgets[row]} us)"
            )


if __name__ == "__main__":
    main()
