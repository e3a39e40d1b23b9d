"""One denoise step of a full-width SDXL UNet and of a FLUX.1 transformer (real width, a few blocks), random
weights, under `auto` against unpatched PyTorch; and each one's working-memory estimate against the memory the
step really allocates.

The models are the families' shipped configs (invokeai/backend/families/*/configs: sdxl's UNet whole, FLUX.1's
transformer with --flux-blocks double and single blocks instead of 19 and 38), built straight on the device with
random weights (benchmarks/_random_models.py). One step is the families' calibration run (`component_run`): the
UNet on a guidance batch of 2, the transformer on packed latents and a 512-token prompt, at --size (1024).

--part steps: per model, the modes (unpatched: PyTorch's own SDPA, flags and order; auto: `install_attention("auto")`;
auto+autotune where the install takes `autotune`) run in interleaved rounds after one warm-up step each; a step is
timed between two device synchronizations. Reported: median and minimum step, unpatched / auto on the minimums
(> 1: auto is faster), and the kernels auto's wrapper counted.

--part memory: under auto, the family's estimator for the call (`estimate_working_memory`, what the model cache
reserves) against torch.cuda.max_memory_allocated during one step minus what was allocated before it; the
calibration's bound for the ratio is 1.0-1.3. On a CPU the measurement is skipped (scripts/calibrate_working_memory.py
measures CPU peaks in forked children): the estimate is printed alone.

--tiny: the families' demo configs at 64 px in float32, one round: a CPU rehearsal of the script (its figures mean
nothing). Lines starting "figure:" are the ones scripts/gpu_check.sh copies into its summary. Needs diffusers.

Usage: PYTHONPATH=. python benchmarks/model_steps.py --part steps|memory [--device cpu|cuda] [--size 1024]
       [--rounds 5] [--flux-blocks 2,4] [--models sdxl,flux] [--tiny]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from _random_models import build_random
from torch.nn.attention import SDPBackend

from invokeai.backend.attention import attention_stats, install_attention, uninstall_attention
from invokeai.backend.attention.policy import KernelFlags, apply_flags, read_flags, settle_pytorch_order
from invokeai.backend.cache.component_runs import component_run
from invokeai.backend.cache.working_memory import CallFacts, estimate_working_memory
from invokeai.backend.families import config_variant

MiB = 2**20
MEMORY_BOUND = (1.0, 1.3)  # scripts/calibrate_working_memory.py's bound for estimate / measured


@dataclass(frozen=True)
class ModelCase:
    """A family's component at the size measured: which shipped config, which run, which dtype."""

    name: str
    family: str
    operation: str
    variant: str
    tiny_variant: str
    dtype: torch.dtype  # on CUDA; float32 on the CPU

    def config(self, tiny: bool, overrides: dict[str, Any]) -> dict[str, Any]:
        config = config_variant(self.tiny_variant if tiny else self.variant).component_config(self.operation)
        return {key: value for key, value in {**config, **overrides}.items() if not key.startswith("_")}


CASES = {
    # SDXL runs in fp16 (its VAE aside), FLUX.1 in bf16, as their users run them.
    "sdxl": ModelCase("SDXL UNet", "sdxl", "unet", "sdxl", "sdxl-demo", torch.float16),
    "flux": ModelCase("FLUX.1 transformer", "flux", "transformer", "flux", "flux-demo", torch.bfloat16),
}


def build(case: ModelCase, device: torch.device, dtype: torch.dtype, tiny: bool, flux_blocks: tuple[int, int]) -> Any:
    import diffusers

    overrides: dict[str, Any] = {}
    if case.family == "flux" and not tiny:
        overrides = {"num_layers": flux_blocks[0], "num_single_layers": flux_blocks[1]}
    variant = config_variant(case.tiny_variant if tiny else case.variant)
    cls = getattr(diffusers, variant.component_config(case.operation)["_class_name"])
    return build_random(cls, case.config(tiny, overrides), device, dtype)


def describe(model: Any, case: ModelCase, dtype: torch.dtype, facts: CallFacts) -> str:
    parameters = sum(p.numel() for p in model.parameters())
    blocks = ""
    if case.family == "flux":
        blocks = f", {model.config.num_layers} double + {model.config.num_single_layers} single blocks"
    return (
        f"{case.name}: {parameters / 1e6:,.1f} M parameters{blocks}, {str(dtype).removeprefix('torch.')}, "
        f"{facts.width}x{facts.height}, batch {facts.batch}{' (x2: guidance)' if case.family == 'sdxl' else ''}"
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def mode(name: str, device: torch.device, pytorch_flags: KernelFlags) -> Iterator[None]:
    """PyTorch left alone ("unpatched": its own SDPA, flags and order), or a setting installed."""
    uninstall_attention()
    if name == "unpatched":
        before = read_flags()
        apply_flags(pytorch_flags)
        try:
            yield
        finally:
            apply_flags(before)
        return
    install_attention("auto", device, **({"autotune": True} if name == "auto+autotune" else {}))
    try:
        yield
    finally:
        uninstall_attention()


@dataclass
class Timing:
    mode: str
    seconds: list[float] = field(default_factory=list)
    kernels: dict[str, int] = field(default_factory=dict)

    def ms(self, pick: Callable[[list[float]], float]) -> float:
        return pick(self.seconds) * 1000


def time_steps(run: Callable[[], Any], device: torch.device, modes: list[str], rounds: int) -> list[Timing]:
    pytorch_flags = read_flags()
    timings = [Timing(name) for name in modes]
    for round_index in range(rounds + 1):
        shift = round_index % len(timings)
        for timing in timings[shift:] + timings[:shift]:
            with mode(timing.mode, device, pytorch_flags), torch.inference_mode():
                run()  # after a change of mode (and in round 0, the warm-up) the first step may pay for set-up
                _sync(device)
                started = time.perf_counter()
                out = run()
                _sync(device)
                elapsed = time.perf_counter() - started
                del out
                if round_index > 0:
                    timing.seconds.append(elapsed)
                    # Only an install counts calls (and resets the count): unpatched PyTorch has no wrapper.
                    counts = attention_stats().counts if timing.mode != "unpatched" else {}
                    for per_kernel in counts.values():
                        for kernel, calls in per_kernel.items():
                            timing.kernels[kernel] = timing.kernels.get(kernel, 0) + calls
    return timings


def part_steps(case: ModelCase, model: Any, facts: CallFacts, device: torch.device, rounds: int) -> None:
    modes = ["unpatched", "auto"]
    if "autotune" in inspect.signature(install_attention).parameters:
        modes.append("auto+autotune")
    run = component_run(case.family, case.operation, model, facts)
    timings = time_steps(run, device, modes, rounds)
    print(f"  {'mode':15s} {'median ms':>10s} {'min ms':>9s}  kernels (calls counted by the wrapper)")
    for timing in timings:
        kernels = ", ".join(f"{k} x{v}" for k, v in sorted(timing.kernels.items())) or "-"
        print(f"  {timing.mode:15s} {timing.ms(statistics.median):10.2f} {timing.ms(min):9.2f}  {kernels}")
    plain = next(t for t in timings if t.mode == "unpatched")
    for timing in timings[1:]:
        ratio = plain.ms(min) / timing.ms(min)
        print(
            f"figure: {case.name} step {facts.width}px on {device.type}: unpatched {plain.ms(min):.2f} ms, "
            f"{timing.mode} {timing.ms(min):.2f} ms = {ratio:.3f}x unpatched (>= 1.00x "
            f"{'PASS' if ratio >= 1.0 else 'FAIL'})"
        )


def part_memory(case: ModelCase, model: Any, facts: CallFacts, device: torch.device, dtype: torch.dtype) -> None:
    install_attention("auto", device)
    try:
        estimate = estimate_working_memory(case.family, case.operation, model.config, facts).total(device, dtype)
        if device.type != "cuda":
            print(
                f"figure: {case.name} working memory {facts.width}px: estimate {estimate / MiB:.1f} MiB; measured: "
                "skipped for lack of CUDA (torch.cuda.max_memory_allocated)"
            )
            return
        run = component_run(case.family, case.operation, model, facts)
        with torch.inference_mode():
            out = run()  # warm-up: cuDNN plans, cuBLAS workspaces and the allocator's first blocks
            del out
            _sync(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            baseline = torch.cuda.memory_allocated(device)
            out = run()
            _sync(device)
            measured = torch.cuda.max_memory_allocated(device) - baseline
            del out
    finally:
        uninstall_attention()
    ratio = estimate / measured if measured > 0 else float("inf")
    low, high = MEMORY_BOUND
    print(
        f"figure: {case.name} working memory {facts.width}px: estimate {estimate / MiB:.1f} MiB, measured "
        f"{measured / MiB:.1f} MiB (max_memory_allocated) = {ratio:.2f} ({low}-{high}: "
        f"{'PASS' if low <= ratio <= high else 'FAIL'})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("steps", "memory"), required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", type=int, help="image width and height (default 1024; --tiny 64)")
    parser.add_argument("--rounds", type=int, help="timed rounds (default 5; --tiny 1)")
    parser.add_argument(
        "--flux-blocks", default="2,4", help="FLUX.1 double and single blocks (default 2,4; the real model: 19,38)"
    )
    parser.add_argument("--models", default="sdxl,flux", help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--tiny", action="store_true", help="the demo configs at 64 px in float32 (CPU rehearsal)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    if not names or any(name not in CASES for name in names):
        parser.error(f"--models takes a comma-separated list of: {', '.join(CASES)}")
    try:
        double, single = (int(part) for part in args.flux_blocks.split(","))
    except ValueError:
        parser.error("--flux-blocks takes two integers: double,single (e.g. 2,4)")
    size = args.size or (64 if args.tiny else 1024)
    rounds = args.rounds or (1 if args.tiny else 5)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download
    logging.getLogger("invokeai.backend.attention").setLevel(logging.ERROR)
    uninstall_attention()
    settle_pytorch_order(device)  # PyTorch ranks its kernels at its first CUDA attention call: the unpatched mode
    print(
        f"model steps: torch {torch.__version__}, {device}"
        f"{f' ({torch.cuda.get_device_name(device)})' if device.type == 'cuda' else ''}, PyTorch's own order "
        f"{[SDPBackend(b).name for b in torch._C._get_sdp_priority_order()]}"
    )
    for name in names:
        case = CASES[name]
        dtype = case.dtype if device.type == "cuda" else torch.float32
        started = time.perf_counter()
        model = build(case, device, dtype, args.tiny, (double, single))
        facts = CallFacts(device, dtype, width=size, height=size, batch=1)
        print(f"\n{describe(model, case, dtype, facts)}; built in {time.perf_counter() - started:.1f} s")
        if args.part == "steps":
            part_steps(case, model, facts, device, rounds)
        else:
            part_memory(case, model, facts, device, dtype)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
