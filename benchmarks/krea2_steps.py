"""Real-size Krea-2 denoise steps under each INVOKE_KREA2_SDPA_BACKEND mode, on one CUDA GPU.

Builds diffusers' default Krea2Transformer2DModel (28 layers, hidden 6144, 48 query / 12 key-value heads, 12.8 B
parameters, 25.6 GB in bf16) straight on the GPU: parameters are created on the meta device and materialised with
`to_empty`, then filled with random values on the GPU (the values do not change the work; nothing is initialised on
the CPU). Prompt embeddings are random too, with a text padding mask as real prompts have, so every main block attends
with the (1, 1, 1, text + image) key-padding mask. Each generation is `families.krea2.generation.denoise`
with classifier-free guidance (two batch-1 transformer calls per step), the grouped-query processor, the window and
the step timer, exactly as a node runs it.

Per size and mode: one warm-up generation, then three measured ones. Modes are interleaved (every mode once per
round), so drift of the machine hits all alike. The window is read once per generation, so the variable is set in
os.environ before each one. Reported: the median step (steps after the first, over the measured generations), the
median first step (kernel selection and allocator warm-up), the peak memory during the loop, each mode's median
step relative to `efficient` (>1 is slower), the kernels that served the attention calls and the grouped/expanded
K/V choices. An exclusive mode whose kernel cannot serve a call fails visibly; that is reported, not hidden.

Needs only torch, diffusers and this repository on PYTHONPATH:
    PYTHONPATH=. python benchmarks/krea2_steps.py [--sizes 1024 1536] [--steps 4] [--json out.json]
Without CUDA it says so and exits 0. `--smoke` runs the same code on a tiny transformer on the CPU, to check the
script itself (its timings mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from _random_models import build_random

from invokeai.backend.attention import attention_stats, install_attention, uninstall_attention
from invokeai.backend.attention.benchmarking import WINDOW_MODES, StepBenchmark
from invokeai.backend.families import config_variant
from invokeai.backend.families.krea2 import generation as krea2
from invokeai.backend.families.krea2.attention import install_krea2_attention
from invokeai.backend.families.krea2.demo import KREA2_TRANSFORMER
from invokeai.backend.families.krea2.generation import WINDOW_ENV
from invokeai.backend.families.krea2.scheduler import make_scheduler

MODES: tuple[str | None, ...] = (None, "efficient", "cudnn", "flash", "priority-cudnn")
REFERENCE_MODE = "efficient"
# A tiny transformer with grouped-query attention, for --smoke only: the demo model's.
SMOKE_CONFIG: dict[str, Any] = dict(KREA2_TRANSFORMER)


def mode_name(mode: str | None) -> str:
    return "unset" if mode is None else mode


class CpuStepTimer(StepBenchmark):
    """The step timer without CUDA synchronisation or memory counters, for --smoke."""

    def start(self) -> None:
        pass

    def _synchronize(self) -> None:
        pass

    def _peak_memory_bytes(self) -> int:
        return 0


def build_transformer(device: torch.device, dtype: torch.dtype, config: dict[str, Any]) -> torch.nn.Module:
    """The transformer with random weights made on `device` only; its zero-centred RMSNorm scales at 0 (multiplier
    1), norm weights in float32 as diffusers loads them."""
    from diffusers import Krea2Transformer2DModel

    return build_random(Krea2Transformer2DModel, config, device, dtype, norm_weight=0.0)


def text_conditioning(
    config: dict[str, Any], text_tokens: int, valid_tokens: int, device: torch.device, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tapped-layer embeddings and a padding mask with `valid_tokens` real tokens, like an encoded prompt."""
    generator = torch.Generator(device).manual_seed(seed)
    shape = (1, text_tokens, config.get("num_text_layers", 12), config.get("text_hidden_dim", 2560))
    embeds = torch.randn(shape, generator=generator, device=device, dtype=dtype)
    mask = torch.zeros(1, text_tokens, dtype=torch.bool, device=device)
    mask[:, :valid_tokens] = True
    return embeds, mask


@dataclass
class ModeResult:
    mode: str
    runs: list[list[float]] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)
    kernels: dict[str, int] = field(default_factory=dict)
    layouts: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    def median_step_ms(self) -> float | None:
        rest = [seconds for run in self.runs for seconds in run[1:]]
        return statistics.median(rest) * 1000 if rest else None

    def first_step_ms(self) -> float | None:
        return statistics.median(run[0] for run in self.runs) * 1000 if self.runs else None

    def peak_gib(self) -> float | None:
        return max(self.peaks) / 2**30 if self.peaks else None


@dataclass
class Bench:
    transformer: torch.nn.Module
    scheduler: Any
    conditioning: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    device: torch.device
    dtype: torch.dtype
    steps: int
    guidance: float

    def generate(self, size: int, mode: str | None) -> StepBenchmark:
        """One generation with the variable set for `mode`; returns its step timer."""
        if mode is None:
            os.environ.pop(WINDOW_ENV, None)
        else:
            os.environ[WINDOW_ENV] = mode
        timer_class = StepBenchmark if self.device.type == "cuda" else CpuStepTimer
        timer = timer_class(self.device, mode_name(mode), f"krea2 {size}x{size}")
        (embeds, mask), (negative, negative_mask) = self.conditioning
        krea2.denoise(
            self.transformer,
            self.scheduler,
            prompt_embeds=embeds,
            prompt_mask=mask,
            negative_embeds=negative,
            negative_mask=negative_mask,
            width=size,
            height=size,
            steps=self.steps,
            guidance_scale=self.guidance,
            seed=0,
            device=self.device,
            dtype=self.dtype,
            benchmark=timer,
        )
        return timer


def _kernel_counts() -> dict[str, int]:
    merged: dict[str, int] = {}
    for per_kernel in attention_stats().counts.values():
        for kernel, calls in per_kernel.items():
            merged[kernel] = merged.get(kernel, 0) + calls
    return merged


def run_size(bench: Bench, size: int, modes: tuple[str | None, ...], runs: int, warmups: int) -> list[ModeResult]:
    results = {mode: ModeResult(mode_name(mode)) for mode in modes}
    policy = install_krea2_attention(bench.transformer)
    for round_index in range(warmups + runs):
        for mode in modes:
            result = results[mode]
            if result.error is not None:
                continue
            before = _kernel_counts()
            try:
                timer = bench.generate(size, mode)
            except RuntimeError as error:
                result.error = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                continue
            finally:
                if bench.device.type == "cuda":
                    torch.cuda.synchronize(bench.device)
            if round_index < warmups:
                continue
            result.runs.append(timer.step_seconds)
            result.peaks.append(int(timer.summary()["peak_memory_bytes"]))
            after = _kernel_counts()
            result.kernels = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            result.layouts = {}
            for layout in policy.decisions.values():
                result.layouts[layout] = result.layouts.get(layout, 0) + 1
    return list(results.values())


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(size: int, results: list[ModeResult]) -> None:
    reference = next((r.median_step_ms() for r in results if r.mode == REFERENCE_MODE), None)
    print(f"\n{size}x{size}")
    header = f"{'mode':<15}{'median step ms':>15}{'first step ms':>15}{'peak GiB':>10}{'vs efficient':>14}  kernels"
    print(header)
    print("-" * len(header))
    for result in results:
        median = result.median_step_ms()
        if result.error is not None:
            print(f"{result.mode:<15}failed: {result.error}")
            continue
        ratio = median / reference if median is not None and reference else None
        kernels = ", ".join(f"{k}={v}" for k, v in sorted(result.kernels.items()))
        layouts = ", ".join(f"{k}={v}" for k, v in sorted(result.layouts.items()))
        print(
            f"{result.mode:<15}{_fmt(median):>15}{_fmt(result.first_step_ms()):>15}{_fmt(result.peak_gib(), 2):>10}"
            f"{_fmt(ratio, 3):>14}  {kernels}; K/V {layouts}"
        )


def describe_device(device: torch.device) -> str:
    if device.type != "cuda":
        return f"cpu, torch {torch.__version__}"
    capability = "".join(map(str, torch.cuda.get_device_capability(device)))
    cudnn = torch.backends.cudnn.version()
    return (
        f"{torch.cuda.get_device_name(device)} (sm_{capability}), torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, cuDNN {cudnn}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 1536])
    parser.add_argument("--steps", type=int, default=4, help="steps per generation (the first is reported apart)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmups", type=int, default=1)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--text-tokens", type=int, default=krea2.MAX_SEQUENCE_LENGTH)
    parser.add_argument("--valid-tokens", type=int, default=77, help="real tokens of the prompt (the rest is padding)")
    parser.add_argument("--modes", nargs="+", default=[mode_name(m) for m in MODES])
    parser.add_argument("--attention-backend", default="auto", help="the attention_backend setting to install")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--smoke", action="store_true", help="tiny transformer on the CPU: checks the script only")
    args = parser.parse_args(argv)

    if args.smoke:
        device, dtype, config = torch.device("cpu"), torch.float32, SMOKE_CONFIG
    elif torch.cuda.is_available():
        device, dtype, config = torch.device("cuda"), torch.bfloat16, {}
    else:
        print("krea2_steps needs a CUDA GPU (the real-size transformer is 25.6 GB in bf16); nothing to do here.")
        return 0
    modes = tuple(None if m == "unset" else m for m in args.modes)
    if any(m is not None and m not in WINDOW_MODES for m in modes):
        parser.error(f"--modes takes unset and {', '.join(WINDOW_MODES)}")

    saved_window = os.environ.get(WINDOW_ENV)
    install_attention(args.attention_backend, device)
    try:
        started = time.perf_counter()
        transformer = build_transformer(device, dtype, config)
        parameters = sum(p.numel() for p in transformer.parameters())
        print(f"device: {describe_device(device)}")
        built = time.perf_counter() - started
        print(
            f"transformer: {parameters / 1e9:.2f} B parameters, {dtype}, built in {built:.1f} s;"
            f" attention_backend {args.attention_backend}, order {', '.join(attention_stats().order)}"
        )
        full_config = {**transformer.config}
        scheduler = make_scheduler("euler", config_variant("krea2").component_config("scheduler"))
        conditioning = (
            text_conditioning(full_config, args.text_tokens, args.valid_tokens, device, dtype, seed=1),
            text_conditioning(full_config, args.text_tokens, krea2.TEMPLATE_SUFFIX_TOKENS, device, dtype, seed=2),
        )
        bench = Bench(transformer, scheduler, conditioning, device, dtype, args.steps, args.guidance)
        print(
            f"{args.steps} steps per generation, guidance {args.guidance} (2 transformer calls per step), "
            f"{args.text_tokens} text tokens ({args.valid_tokens} real), {args.warmups} warm-up + {args.runs} measured "
            "generations per mode, modes interleaved"
        )
        report: dict[str, Any] = {"device": describe_device(device), "sizes": {}}
        for size in args.sizes:
            results = run_size(bench, size, modes, args.runs, args.warmups)
            print_table(size, results)
            report["sizes"][str(size)] = [
                {
                    "mode": r.mode,
                    "median_step_ms": r.median_step_ms(),
                    "first_step_ms": r.first_step_ms(),
                    "peak_gib": r.peak_gib(),
                    "step_seconds": r.runs,
                    "kernels": r.kernels,
                    "kv_layouts": r.layouts,
                    "error": r.error,
                }
                for r in results
            ]
        if args.json:
            with open(args.json, "w", encoding="utf-8") as out:
                json.dump(report, out, indent=2)
    finally:
        if saved_window is None:
            os.environ.pop(WINDOW_ENV, None)
        else:
            os.environ[WINDOW_ENV] = saved_window
        uninstall_attention()
    return 0


if __name__ == "__main__":
    sys.exit(main())
