"""The cuDNN guard layer: on data-centre Blackwell (sm100 family), calls with fewer than 8 key-value heads skip cuDNN.

On B200, PyTorch's cuDNN attention silently corrupts the output of models with fewer than 8 key-value heads
(pytorch#193893, open: the same with torch 2.11 / cuDNN 9.19 and torch 2.13 / cuDNN 9.20). PyTorch ranks cuDNN first
there, and so does `auto` (policy.py), so the grouped-query text encoders (Qwen2.5-VL: 4 key-value heads) would land
on it. The issue's boundary is the absolute key-value head count (somewhere between 4 and 8), not the ratio of query
to key-value heads, so the guard looks at the key's head count of a 4-D call (`key.shape[-3]`): for a grouped-query
call (`enable_gqa`) its key-value heads; for a plain multi-head call every head is a key-value head, so one with
fewer than 8 heads is guarded too (cuDNN refuses most such calls on other grounds: a VAE's one 512-wide head). A
caller that repeats key and value up to the query heads before SDPA passes as many key heads as query heads; what
it repeated is not visible here.

A call the dispatcher sends to cuDNN there runs instead on the next kernel of the installed order that is enabled
and can serve it (PyTorch's own eligibility checks, `devices.kernel_can_serve`), through that kernel's aten operator
with the preprocessing PyTorch's SDPA applies before it (`kernels.py`): never by switching the process-global
flags, which would leak into other threads' calls. Math runs as the ROCm guard runs it (chunked above 1 GiB of
scores). It is reported once per (node type, serving kernel). Only where nothing else is enabled (an exclusive
cuDNN benchmarking window) does cuDNN keep the call.

The layer is composed only on the sm100 family and only while the torch at hand is older than FIXED_IN.
"""

from __future__ import annotations

import logging
import threading

import torch
from torch.nn.attention import SDPBackend
from torch.torch_version import TorchVersion

from invokeai.backend import devices
from invokeai.backend.attention import kernels, stats
from invokeai.backend.attention.architecture import DeviceFacts
from invokeai.backend.attention.caller import current_node_type
from invokeai.backend.attention.layer import Call, Layer, Rebuild, Reroute, Route
from invokeai.backend.attention.policy import read_flags
from invokeai.backend.attention.routing import describe_call
from invokeai.backend.attention.state import AttentionState

logger = logging.getLogger(__name__)

CUDNN = "CUDNN_ATTENTION"
CUDNN_GUARD = "cudnn_guard"
ISSUE = "pytorch#193893"
GUARDED_MAJOR = 10  # sm100, sm103: B200, B300 (GB200, GB300)
MIN_KV_HEADS = 8
# The first torch release with pytorch#193893 fixed, e.g. "2.14.0": from it on the layer is not composed. None while
# the issue is open (torch 2.13.0 still corrupts, per the issue's bisect of 2026-08-18).
FIXED_IN: str | None = None

EXPLANATION = (
    f"on sm100-family GPUs (B200) cuDNN corrupts the output of calls with fewer than {MIN_KV_HEADS} key-value heads "
    f"({ISSUE})"
)


def needed(facts: DeviceFacts, torch_version: str = torch.__version__) -> bool:
    """Whether a device needs the guard: an NVIDIA sm10x GPU, on a torch without the fix."""
    if facts.platform != "cuda" or facts.capability is None or facts.capability[0] != GUARDED_MAJOR:
        return False
    return FIXED_IN is None or TorchVersion(torch_version) < FIXED_IN


class _Guarded:
    """A kernel reached through the guard rather than through PyTorch's order; it reads as the kernel's name."""

    def __init__(self, kernel: str, run: Call) -> None:
        self.kernel = kernel
        self.run = run

    def __str__(self) -> str:
        return self.kernel

    def __repr__(self) -> str:
        return f"CUDNN_GUARDED_{self.kernel}"


GUARDED: dict[str, _Guarded] = {
    name: _Guarded(name, kernels.RUNS[name]) for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
}


class CudnnGuard(Layer):
    name = "cudnn_guard"

    def active(self, state: AttentionState) -> bool:
        # Once cuDNN is demoted no call reaches it: nothing left to guard.
        return state.cudnn_guarded and not state.cudnn_demoted

    def reroute(self, state: AttentionState) -> Reroute | None:
        can_serve = devices.kernel_can_serve

        def few_kv_heads(chosen, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
            if chosen != CUDNN or k.dim() != 4 or k.shape[-3] >= MIN_KV_HEADS:
                return None
            flags = read_flags()  # the order in force: the installed one, or an open window's
            for value in flags.order:
                kernel = SDPBackend(value)
                guarded = GUARDED.get(kernel.name)
                if guarded is not None and kernel in flags.enabled and can_serve(kernel.name, q, k, v, m, d, c, g):
                    return guarded
            return None  # nothing else is enabled: an exclusive cuDNN window keeps the call

        return few_kv_heads

    def wrap(self, state: AttentionState, inner: Call, rebuild: Rebuild) -> Call:
        count = stats.count
        seen = stats.reported_keys
        lock = threading.Lock()
        pinned_cudnn = state.pinned is SDPBackend.CUDNN_ATTENTION
        setting = state.setting

        def report(route: _Guarded, q, k, m, d, c, g) -> None:  # type: ignore[no-untyped-def]
            node = current_node_type()
            key = (node, CUDNN, route.kernel, CUDNN_GUARD)
            with lock:
                if key in seen:
                    return
                seen.add(key)
            lead = (
                f"attention_backend {setting!r} is not possible for attention in {node}"
                if pinned_cudnn
                else f"cuDNN attention is skipped for attention in {node}"
            )
            message = f"{lead}: {EXPLANATION} ({describe_call(q, k, m, d, c, g)}); it runs on {route.kernel}."
            logger.warning(message)
            stats.reports.append(
                stats.AttentionReport(
                    node_type=node, pinned=CUDNN, serving=route.kernel, reason=CUDNN_GUARD, message=message
                )
            )

        def guard(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
            if route.__class__ is not _Guarded:
                return inner(route, q, k, v, m, d, c, s, g)
            out = route.run(q, k, v, m, d, c, s, g)
            count(route)
            report(route, q, k, m, d, c, g)
            return out

        return guard

    def reason(self, state: AttentionState, pinned: str, route: Route) -> tuple[str, str] | None:
        if pinned == CUDNN and route.__class__ is _Guarded:
            return CUDNN_GUARD, EXPLANATION
        return None
