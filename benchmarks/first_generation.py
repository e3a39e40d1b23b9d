"""The first image of a fresh process against a warm one, through the families' generation code (no server), on
the SD-1 demo model: where a first image's time goes on this device.

The demo model (demo-sd1: the real SD-1 architecture, tiny and random) is built in a scratch folder, then a fresh
Python process, as the server's worker would, times in turn:
- start: the interpreter and `import torch` (from the spawn to the child's first line), then the imports a
  generation needs (diffusers, transformers, the family's generation module), then `install_attention("auto")`;
- load: tokenizer, text encoder, UNet, VAE and scheduler from the folder onto the device, in the server's dtype
  for the device (`choose_dtype("auto")`);
- the first generation (both prompts encoded, --steps euler steps with guidance 7.5 at --size, the VAE decode), each
  part timed between device synchronizations;
- --warm more identical generations: a warm one is the fastest of them.
Reported: each phase, the first item (load + first generation, what the first queue item after a start pays) and
the first generation alone, each as a multiple of a warm generation. Issue 26's target: the first image at most
2x a warm one. The prompts, seed, size, steps and scheduler are docs/examples/sd_text_to_image.json's.
Lines starting "figure:" are the ones scripts/gpu_check.sh copies into its summary. Needs diffusers.

Usage: PYTHONPATH=. python benchmarks/first_generation.py [--device cpu|cuda] [--steps 20] [--size 64] [--warm 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

DEMO = "demo-sd1"
POSITIVE = "a lighthouse on a rocky cliff at sunset, oil painting"
NEGATIVE = "blurry, low quality"
SEED = 42
TARGET = 2.0
COMPONENTS = ("tokenizer", "text_encoder", "unet", "vae", "scheduler")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def child(folder: Path, device: torch.device, steps: int, size: int, warm: int) -> dict[str, Any]:
    """Everything after `import torch`, timed in this fresh process."""
    entered = time.time()
    timings: dict[str, Any] = {"entered": entered}
    started = time.perf_counter()
    import diffusers  # noqa: F401  (what the first node pays for: the libraries, then the family's code)
    import transformers  # noqa: F401

    from invokeai.backend.attention import install_attention
    from invokeai.backend.devices import choose_dtype
    from invokeai.backend.families.sd1 import generation as sd1
    from invokeai.backend.families.sd1.descriptor import FAMILY
    from invokeai.backend.models.load_diffusers import load_diffusers_component

    timings["imports"] = time.perf_counter() - started
    started = time.perf_counter()
    install_attention("auto", device)
    timings["attention install"] = time.perf_counter() - started
    dtype = choose_dtype("auto", device)
    timings["dtype"] = str(dtype).removeprefix("torch.")

    started = time.perf_counter()
    parts: dict[str, Any] = {}
    for name in COMPONENTS:
        part = load_diffusers_component(folder, name, dtype)
        parts[name] = part.to(device) if isinstance(part, torch.nn.Module) else part
    _sync(device)
    timings["load"] = time.perf_counter() - started

    def generate() -> dict[str, float]:
        phases: dict[str, float] = {}
        began = time.perf_counter()
        positive = sd1.encode_prompt(parts["text_encoder"], parts["tokenizer"], POSITIVE, device)
        negative = sd1.encode_prompt(parts["text_encoder"], parts["tokenizer"], NEGATIVE, device)
        _sync(device)
        phases["encode"] = time.perf_counter() - began
        began = time.perf_counter()
        scheduler = FAMILY.make_scheduler("euler", dict(parts["scheduler"].config))
        latents = sd1.denoise(
            parts["unet"], scheduler, positive=positive, negative=negative, width=size, height=size, steps=steps,
            cfg_scale=7.5, seed=SEED, device=device, dtype=dtype,
        )  # fmt: skip
        _sync(device)
        phases["denoise"] = time.perf_counter() - began
        began = time.perf_counter()
        sd1.vae_decode(parts["vae"], latents)
        _sync(device)
        phases["decode"] = time.perf_counter() - began
        phases["total"] = sum(phases.values())
        return phases

    timings["first"] = generate()
    timings["warm"] = min((generate() for _ in range(warm)), key=lambda phases: phases["total"])
    return timings


def run_child(folder: Path, args: argparse.Namespace) -> tuple[float, dict[str, Any]]:
    """The child's timings and the time from its spawn to its first line (interpreter and `import torch`)."""
    command = [
        sys.executable, __file__, "--child", str(folder), "--device", args.device, "--steps", str(args.steps),
        "--size", str(args.size), "--warm", str(args.warm),
    ]  # fmt: skip
    spawned = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed (rc {done.returncode}):\n{done.stderr[-2000:]}")
    timings = json.loads(done.stdout.strip().splitlines()[-1])
    return timings["entered"] - spawned, timings


def report(startup: float, t: dict[str, Any], args: argparse.Namespace) -> None:
    first, warm = t["first"], t["warm"]
    start = startup + t["imports"] + t["attention install"]
    print(f"{DEMO} on {args.device} ({t['dtype']}), {args.steps} euler steps at {args.size}x{args.size}, guidance 7.5")
    print(
        f"  start {start:.2f} s: python + import torch {startup:.2f} s, imports {t['imports']:.2f} s, "
        f"install_attention {t['attention install']:.3f} s"
    )
    print(f"  load {t['load']:.3f} s ({', '.join(COMPONENTS)})")
    print(f"  {'':12s} {'encode s':>9s} {'denoise s':>10s} {'decode s':>9s} {'total s':>8s}")
    for name, phases in (("first", first), (f"warm (min {args.warm})", warm)):
        print(
            f"  {name:12s} {phases['encode']:9.3f} {phases['denoise']:10.3f} {phases['decode']:9.3f} "
            f"{phases['total']:8.3f}"
        )
    item = (t["load"] + first["total"]) / warm["total"]
    alone = first["total"] / warm["total"]
    print(
        f"figure: first image {DEMO} on {args.device}: start {start:.2f} s, load {t['load']:.2f} s, first generation "
        f"{first['total']:.3f} s, warm {warm['total']:.3f} s; first item (load + generation) = {item:.1f}x warm "
        f"(<= {TARGET:.0f}x {'PASS' if item <= TARGET else 'FAIL'}), first generation alone = {alone:.1f}x warm"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--warm", type=int, default=3, help="warm generations after the first (the fastest counts)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    if args.steps < 1 or args.warm < 1 or args.size % 8:
        parser.error("--steps and --warm take 1 or more; --size a multiple of 8")
    if args.child:
        timings = child(Path(args.child), torch.device(args.device), args.steps, args.size, args.warm)
        print(json.dumps(timings))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from invokeai.app.logging_setup import configure_logging, route_ml_library_logging
    from invokeai.backend.models.demo import build_demo_models

    # The server's logging: one line format, no progress bars, no notices about image processors never run.
    configure_logging("warning")
    route_ml_library_logging()

    with tempfile.TemporaryDirectory(prefix="first-generation-") as scratch:
        started = time.perf_counter()
        (built,) = build_demo_models(Path(scratch), (DEMO,))
        print(f"built {DEMO} in {time.perf_counter() - started:.1f} s (not timed below)")
        startup, timings = run_child(built.path, args)
    report(startup, timings, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
