"""What `auto` chooses on this device, and why: the order the policy ranks and its reason, PyTorch's own order,
which kernel each model call is served by under auto and under PyTorch left alone, and (with `--part autotune`)
what measured autotuning chooses for each call. No timing of its own: benchmarks/attention_kernels.py times.

--part order: the policy's order and reason for every setting on this device (`policy.ranking`; with an older
policy, `kernel_order`, else the installed order), the same for stand-in architectures (sm86, sm90 and sm100 with
cuDNN 9.16: what a CPU rehearsal can check), PyTorch's own order here, and per call (benchmarks/_attention_calls.py)
the kernel PyTorch's dispatcher picks unpatched against the one auto's wrapper serves it with.

--part autotune: installs auto with `autotune=True` (invokeai/backend/attention/autotune.py, issue 26 section 2),
makes each call once, prints the autotuner's choice per bucket with the timings it chose by and its cost, then
installs again on the same autotune file and checks that every choice is read back instead of timed. Where this
checkout has no autotune module (or its install takes no `autotune`), it prints "skipped: no autotune module" and
exits 0.

Lines starting "figure:" are the ones scripts/gpu_check.sh copies into its summary.

Usage: PYTHONPATH=. python benchmarks/attention_choices.py --part order|autotune [--device cpu|cuda] [--tiny]
       [--dtypes bf16,fp16]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _attention_calls import (
    CallShape,
    add_call_arguments,
    chosen_calls,
    dispatcher_choice,
    dtype_name,
)
from torch.nn.attention import SDPBackend

from invokeai.backend.attention import (
    ATTENTION_SETTINGS,
    attention_stats,
    install_attention,
    policy,
    serving_kernel,
    uninstall_attention,
)

AUTOTUNE_MODULE = "invokeai.backend.attention.autotune"
# Architectures the CPU can stand in for: the ranking is a function of these facts.
STAND_INS: tuple[tuple[str, tuple[int, int], int], ...] = (
    ("RTX 4090 (sm89)", (8, 9), 91600),
    ("H100/H200 (sm90)", (9, 0), 91600),
    ("H100/H200 with cuDNN 9.10 (sm90)", (9, 0), 91000),
    ("B200 (sm100)", (10, 0), 91600),
)


def _names(order: Any) -> str:
    return ", ".join(getattr(kernel, "name", str(kernel)) for kernel in order)


def order_and_reason(setting: str, device: torch.device | None, **facts: Any) -> tuple[str, str]:
    """The order `setting` ranks and why, with whatever this checkout's policy offers."""
    if hasattr(policy, "ranking"):
        ranked = policy.ranking(setting, device=device, **facts)
        return _names(ranked.order), ranked.reason
    if hasattr(policy, "kernel_order"):
        parameters = inspect.signature(policy.kernel_order).parameters
        if facts and not all(name in parameters for name in facts):
            return "-", "this policy's kernel_order takes no device facts"
        return _names(policy.kernel_order(setting, **facts)), "(this policy gives no reason)"
    if facts or device is None:
        return "-", "this policy ranks only the device at hand"
    install_attention(setting, device)
    try:
        return _names(attention_stats().order), "(the installed order; this policy gives no reason)"
    finally:
        uninstall_attention()


def part_order(device: torch.device, calls: tuple[CallShape, ...], dtypes: tuple[torch.dtype, ...]) -> int:
    uninstall_attention()
    if hasattr(policy, "settle_pytorch_order"):
        policy.settle_pytorch_order(device)  # PyTorch ranks its kernels at its first CUDA attention dispatch
    pytorch_order = [SDPBackend(b).name for b in torch._C._get_sdp_priority_order()]
    facts = policy.device_facts(device).describe() if hasattr(policy, "device_facts") else device.type
    print(f"device {device} ({facts}), torch {torch.__version__}")
    print(f"figure: PyTorch's own order here: {', '.join(pytorch_order)}")
    for setting in ATTENTION_SETTINGS:
        order, reason = order_and_reason(setting, device)
        prefix = "figure: " if setting == "auto" else ""
        print(f"{prefix}{setting} on this device: {order} -- {reason}")
    print("\nstand-in architectures (the ranking from the facts alone):")
    for name, capability, cudnn in STAND_INS:
        order, reason = order_and_reason("auto", None, capability=capability, cudnn_version=cudnn)
        print(f"  auto on {name}, cuDNN {cudnn}: {order} -- {reason}")

    print("\nserving kernel per call: PyTorch unpatched -> auto")
    logging.getLogger("invokeai.backend.attention").setLevel(logging.ERROR)
    install_attention("auto", device)
    try:
        for dtype in dtypes:
            for call in calls:
                q, k, v, kwargs = call.inputs(device, dtype)
                uninstall_attention()
                try:
                    plain = dispatcher_choice(q, k, v, kwargs)
                except RuntimeError as error:
                    plain = f"none ({str(error).strip().splitlines()[0][:60]})"
                install_attention("auto", device)
                served = getattr(serving_kernel(q, k, v, **kwargs), "name", "sage")
                same = "same" if served == plain else "differs"
                print(f"figure: serving {call.label} {dtype_name(dtype)}: unpatched {plain} -> auto {served} ({same})")
                del q, k, v, kwargs
    finally:
        uninstall_attention()
    return 0


def _choice_text(choice: Any) -> str:
    bucket = getattr(choice, "bucket", None)
    where = (
        f"{bucket.dtype} d{bucket.head_dim} {bucket.heads}h{' gqa' if bucket.grouped else ''} "
        f"q{bucket.query_len} k{bucket.key_len} {bucket.mask}"
        if bucket is not None
        else "?"
    )
    timings = ", ".join(
        f"{t.kernel} {t.ms:.3f} ms" if getattr(t, "ms", None) is not None else f"{t.kernel} ({getattr(t, 'note', '')})"
        for t in getattr(choice, "timings", [])
    )
    return (
        f"bucket [{where}] -> {choice.kernel} ({getattr(choice, 'source', '?')}, cost "
        f"{getattr(choice, 'cost_ms', 0.0):.1f} ms; {timings or 'no timings'})"
    )


def part_autotune(device: torch.device, calls: tuple[CallShape, ...], dtypes: tuple[torch.dtype, ...]) -> int:
    if importlib.util.find_spec(AUTOTUNE_MODULE) is None:
        print(f"figure: skipped: no autotune module ({AUTOTUNE_MODULE} is not in this checkout)")
        return 0
    if "autotune" not in inspect.signature(install_attention).parameters:
        print("figure: skipped: no autotune module wired in (install_attention takes no autotune option)")
        return 0
    logging.getLogger("invokeai.backend.attention").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="attention-choices-") as scratch:
        tuning_file = Path(scratch) / "attention_autotune.json"
        install_attention("auto", device, autotune=True, autotune_file=tuning_file)
        try:
            for dtype in dtypes:
                for call in calls:
                    q, k, v, kwargs = call.inputs(device, dtype)
                    F.scaled_dot_product_attention(q, k, v, **kwargs)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    tuned = getattr(attention_stats(), "tuned", [])
                    latest = _choice_text(tuned[-1]) if tuned else "no choice recorded"
                    print(f"figure: autotune {call.label} {dtype_name(dtype)}: {latest}")
                    del q, k, v, kwargs
            measured = list(getattr(attention_stats(), "tuned", []))
        finally:
            uninstall_attention()
        total_cost = sum(getattr(choice, "cost_ms", 0.0) for choice in measured)
        print(f"figure: autotune cost: {total_cost:.0f} ms over {len(measured)} buckets")
        # A later start on the same GPU, torch and cuDNN reads the choices back instead of timing them.
        install_attention("auto", device, autotune=True, autotune_file=tuning_file)
        try:
            for dtype in dtypes:
                for call in calls:
                    q, k, v, kwargs = call.inputs(device, dtype)
                    F.scaled_dot_product_attention(q, k, v, **kwargs)
                    del q, k, v, kwargs
            reread = list(getattr(attention_stats(), "tuned", []))
        finally:
            uninstall_attention()
    from_file = sum(1 for choice in reread if getattr(choice, "source", None) == "file")
    agree = sum(1 for a, b in zip(measured, reread, strict=False) if a.kernel == b.kernel)
    print(
        f"figure: autotune file reuse: {from_file} of {len(reread)} choices read back, {agree} of {len(measured)} "
        "the same kernel as measured"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("order", "autotune"), required=True)
    add_call_arguments(parser)
    args = parser.parse_args(argv)
    device, dtypes, calls = chosen_calls(parser, args)
    return (part_order if args.part == "order" else part_autotune)(device, calls, dtypes)


if __name__ == "__main__":
    sys.exit(main())
