"""Measure each working-memory estimator against the real peak of its component on this device, for the demo models.

For every registered (family, component) it builds the demo models (build_demo_models, in a temporary folder),
loads the component, and runs one forward pass (text encoder on a padded prompt; UNet/transformer one denoise step
with the family's guidance batch; VAE decode/encode) at each size, printing the estimate, the measured peak and their
ratio, with a fingerprint (device, torch version, dtype, attention_backend). It asserts nothing.

--full-size [FAMILY] measures a full-size model of the family (SD-1.5 by default) instead: its shipped configuration
(the family's first non-demo config variant, or --variant) built with the real diffusers/transformers classes,
randomly initialised and saved as fp16 safetensors (about 2 GB for SD-1.5) in the temporary folder, then loaded like
any installed model; only the measured components get weights, and --override changes config values first (a
transformer of real width with a few blocks: --override num_layers=2,num_single_layers=2). It defaults to 256 and
512 px and one repeat (the whole float32 SD-1.5 run takes about four minutes on one CPU thread; the batch stays 1,
every estimate but the text encoder's being above --min-mib): the demo models' weights and layers are too small to
show what dominates at full size, such as the copy oneDNN makes of a 2560-channel convolution's weight on every
call. --components limits either run to some components.

How the peak is measured:
- CPU (Linux): each component runs in a forked child of a parent that has run no torch op. The child loads the
  model, builds the inputs, and runs the forward pass once to warm up (thread pools, one-time kernel buffers, code
  pages); then, per repeat, it frees what it can (gc, malloc_trim), takes the resident set as the baseline, resets
  the peak (/proc/self/clear_refs) and runs the pass again: the growth of VmHWM over the baseline is the figure.
  glibc's mmap threshold is pinned at one page, so every tensor gets its own mapping, is unmapped when freed, and
  the kernel records the peak at each unmap: RSS then follows live tensor bytes instead of heap fragments. The
  kernel's RSS counters are batched (a few hundred KiB on a small machine), so the batch is raised until the
  estimate reaches --min-mib, and each row is the median of --repeats runs.
- CUDA: in this process; torch.cuda.max_memory_allocated over the pass minus memory_allocated before it.

Usage: PYTHONPATH=. python scripts/calibrate_working_memory.py [--device cpu|cuda] [--dtype float32|float16|bfloat16]
       [--sizes 64,128,256] [--repeats 5] [--attention-backend auto] [--min-mib 8 | --batch N]
       [--demo NAME] [--facts JSON]
       [--full-size [FAMILY] [--variant NAME] [--override key=value,...]]
       [--components unet,vae_decode,vae_encode,text_encoder,transformer]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _forked import in_forked_child

from invokeai.app.logging_setup import configure_logging, route_ml_library_logging
from invokeai.backend.attention import install_attention
from invokeai.backend.cache.component_runs import component_run
from invokeai.backend.cache.working_memory import ESTIMATORS, CallFacts, model_component
from invokeai.backend.devices import DTYPES

FULL_SIZE_FOLDER = "full-size"
TEXT_COMPONENTS = ("text_encoder", "text_encoder_2")  # no resolution: one row each
M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)
MAX_BATCH = 64


@dataclass(frozen=True)
class Row:
    family: str
    component: str
    size: str
    batch: int
    model_bytes: int
    estimate: int
    measured: int

    @property
    def ratio(self) -> float:
        return self.estimate / self.measured if self.measured > 0 else math.inf


def _status_bytes(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _cpu_peak(run: Any, libc: Any) -> int:
    gc.collect()
    libc.malloc_trim(0)
    baseline = _status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
        clear.write("5")
    out = run()
    del out
    return _status_bytes("VmHWM") - baseline


def _cuda_peak(run: Any, device: torch.device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    out = run()
    torch.cuda.synchronize(device)
    del out
    return torch.cuda.max_memory_allocated(device) - baseline


def _facts(args: argparse.Namespace, size: int, batch: int) -> CallFacts:
    return CallFacts(
        torch.device(args.device), DTYPES[args.dtype], **{"width": size, "height": size, **args.facts, "batch": batch}
    )


def _batch_for(estimator: Any, config: Any, args: argparse.Namespace, size: int) -> int:
    """--batch, else the smallest batch whose estimate reaches --min-mib (1 when the limit is 0)."""
    if args.batch:
        return args.batch
    one = estimator(config, _facts(args, size, 1)).total(args.device, DTYPES[args.dtype])
    wanted = args.min_mib * 2**20
    return max(1, min(MAX_BATCH, math.ceil(wanted / one))) if one > 0 else 1


def measure_component(family: str, component: str, demo_root: Path, args: argparse.Namespace) -> list[Row]:
    """Load one component and measure it at every size (runs in a child on CPU)."""
    from invokeai.backend.models.load_diffusers import load_diffusers_component

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    install_attention(args.attention_backend, device)
    folder = demo_root / _folder(family, args)
    # Straight from the folder: a full-size build has weights only for the components measured.
    model = load_diffusers_component(folder, model_component(family, component), dtype).to(device).eval()
    model_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    estimator = ESTIMATORS[(family, component)]
    libc = ctypes.CDLL("libc.so.6") if device.type == "cpu" else None
    rows = []
    sizes = args.sizes[:1] if component in TEXT_COMPONENTS else args.sizes
    for size in sizes:
        batch = _batch_for(estimator, model.config, args, size)
        facts = _facts(args, size, batch)
        estimate = estimator(model.config, facts).total(device, dtype)
        with torch.inference_mode():
            run = component_run(family, component, model, facts)
            out = run()  # warm-up
            del out
            peaks = [_cpu_peak(run, libc) if libc is not None else _cuda_peak(run, device) for _ in range(args.repeats)]
        label = "prompt" if component in TEXT_COMPONENTS else f"{size}x{size}"
        rows.append(Row(family, component, label, batch, model_bytes, estimate, int(statistics.median(peaks))))
    return rows


def _in_child(function: Any, *args: Any) -> Any:
    """Run `function(*args)` in a forked child (one torch thread) and return its JSON-able result."""
    return in_forked_child(
        function, *args, what=f"{function.__name__}{args[:2]}", setup=lambda: torch.set_num_threads(1)
    )


def _demo_folder(family: str, name: str | None = None) -> str:
    """The family's demo model `name`, else its first that is a whole diffusers pipeline: every component to
    measure."""
    from invokeai.backend.families import get_family

    return next(
        demo.filename
        for demo in get_family(family).demos
        if demo.format == "diffusers" and (name is None or demo.name == name)
    )


def _folder(family: str, args: argparse.Namespace) -> str:
    return FULL_SIZE_FOLDER if args.full_size else _demo_folder(family, args.demo)


def _build_demos(root: Path, families: list[str], demo: str | None = None) -> list[str]:
    from invokeai.backend.families import get_family
    from invokeai.backend.models.demo import build_demo_models

    names = tuple(d.name for f in families for d in get_family(f).demos if d.filename == _demo_folder(f, demo))
    return [model.name for model in build_demo_models(root, names)]


def _full_size_variant(args: argparse.Namespace) -> Any:
    from invokeai.backend.families import config_variant, get_family

    if args.variant:
        return config_variant(args.variant)
    return next(v for v in get_family(args.full_size).config_variants if not v.name.endswith("-demo"))


def _build_full_size(root: Path, components: list[str], args: argparse.Namespace) -> list[str]:
    """The family's shipped configuration with random fp16 weights, as an installable pipeline folder; only the
    `components` measured get weights (the others keep their configs), each config first updated with --override
    (e.g. a transformer of real width with fewer blocks)."""
    import shutil

    from invokeai.backend.models.load_diffusers import component_class

    folder = root / FULL_SIZE_FOLDER
    shutil.copytree(_full_size_variant(args).path, folder)
    torch.manual_seed(0)
    for name in components:
        cls = component_class(folder, name)
        if cls.__module__.startswith("diffusers"):
            config = {**cls.load_config(folder / name), **args.override}
            model = cls.from_config(config)
        else:
            config = cls.config_class.from_pretrained(folder / name)
            for key, value in args.override.items():
                setattr(config, key, value)
            model = cls(config)
        model = model.half()  # not .to(dtype): diffusers warns about fp32-kept modules there
        model.save_pretrained(folder / name, safe_serialization=True)
        del model
    return [FULL_SIZE_FOLDER]


def _import_component_classes(root: Path, components: list[tuple[str, str]], args: argparse.Namespace) -> None:
    """Import every model class the measured folders name, once, before the children fork: each child then starts
    from loaded modules instead of spending seconds importing diffusers and transformers."""
    import diffusers

    from invokeai.backend.models.load_diffusers import component_class

    for family, component in components:
        component_class(root / _folder(family, args), model_component(family, component))
        # The pipeline class too: some runs take helpers from it (Krea-2's position ids).
        index = json.loads((root / _folder(family, args) / "model_index.json").read_text(encoding="utf-8"))
        getattr(diffusers, index["_class_name"])


def _measure_as_dicts(family: str, component: str, root: str, args: argparse.Namespace) -> list[dict]:
    return [row.__dict__ for row in measure_component(family, component, Path(root), args)]


def fingerprint(args: argparse.Namespace) -> str:
    device = torch.device(args.device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
                name = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return (
        f"device={device.type} ({name}) torch={torch.__version__} dtype={args.dtype} "
        f"attention_backend={args.attention_backend}"
    )


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"# {fingerprint(args)}")
    header = f"{'family':7} {'component':13} {'size':8} {'batch':>5} {'model MiB':>9} {'estimate MiB':>12} "
    print(header + f"{'measured MiB':>12} {'ratio':>6}")
    for row in rows:
        print(
            f"{row.family:7} {row.component:13} {row.size:8} {row.batch:5d} {row.model_bytes / 2**20:9.2f} "
            f"{row.estimate / 2**20:12.3f} {row.measured / 2**20:12.3f} {row.ratio:6.2f}"
        )


def _tuples(value: Any) -> Any:
    """JSON lists as the tuples CallFacts holds."""
    return tuple(_tuples(item) for item in value) if isinstance(value, list) else value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--sizes", default=None, type=lambda text: [int(s) for s in text.split(",")])
    parser.add_argument("--repeats", default=None, type=int, help="default 5, 1 with --full-size")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--batch", default=0, type=int, help="one batch for every row instead of --min-mib's")
    parser.add_argument("--min-mib", default=None, type=float, help="CPU default 8, CUDA default 0 (batch 1)")
    parser.add_argument(
        "--full-size",
        nargs="?",
        const="sd-1",
        default=None,
        metavar="FAMILY",
        help="a full-size model of FAMILY (default sd-1: its shipped config, random fp16 weights, ~2 GB for SD-1.5, "
        "in the temporary folder) instead of the demo models; sizes default to 256,512",
    )
    parser.add_argument("--variant", default=None, help="with --full-size: the shipped config to build")
    parser.add_argument(
        "--override",
        default={},
        type=lambda text: {k: json.loads(v) for k, v in (item.split("=", 1) for item in text.split(","))},
        help='with --full-size: config values to change, e.g. "num_layers=2,num_single_layers=2"',
    )
    parser.add_argument(
        "--demo",
        default=None,
        help="measure this demo model (a whole pipeline; its family's components only) instead of each family's "
        "first, e.g. demo-qwen-image-edit",
    )
    parser.add_argument(
        "--facts",
        default={},
        type=lambda text: {k: _tuples(v) for k, v in json.loads(text).items()},
        help='CallFacts for every row beside the size and batch, as JSON, e.g. \'{"prompt_tokens": 340, '
        '"text_padded": false, "vision_patches": [[16, 16]]}\' (a Qwen-Image-Edit text encoder with one image)',
    )
    parser.add_argument(
        "--components",
        default=None,
        type=lambda text: text.split(","),
        help="only these components (e.g. unet,vae_encode); default every one the models have",
    )
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = [256, 512] if args.full_size else [64, 128, 256]
    if args.repeats is None:
        args.repeats = 1 if args.full_size else 5
    if args.min_mib is None:
        args.min_mib = 8.0 if args.device == "cpu" else 0.0
    return args


def main(argv: list[str] | None = None) -> int:
    from invokeai.backend.families import get_family

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before diffusers loads huggingface_hub: nothing may download
    args = parse_args(argv)
    cpu = args.device == "cpu"
    if cpu:
        if not (sys.platform.startswith("linux") and os.path.exists("/proc/self/clear_refs")):
            print("CPU calibration needs Linux (/proc/self/clear_refs resets the peak resident set)")
            return 1
        # Before any tensor exists, so every tensor of a page or more is its own mapping (see the docstring).
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 4096)
    # The server's logging: one line format, no progress bars, no notices about image processors never run.
    configure_logging("warning")
    route_ml_library_logging()
    components = [
        (family, component)
        for family, component in ESTIMATORS
        if args.full_size in (None, family)
        and (args.components is None or component in args.components)
        and (args.demo is None or any(demo.name == args.demo for demo in get_family(family).demos))
    ]
    if not components:
        print(f"nothing to measure: no estimator of {args.full_size or 'any family'} among {args.components}")
        return 2
    families = sorted({family for family, _ in components})
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="calibrate-wm-") as tmp:
        if args.full_size:
            modules = sorted({model_component(family, component) for family, component in components})
            build, build_args = _build_full_size, (Path(tmp), modules, args)
        else:
            build, build_args = _build_demos, (Path(tmp), families, args.demo)
        # The build runs torch ops; in a child, so the parent forks measurement children with no thread pool.
        _in_child(build, *build_args) if cpu else build(*build_args)
        _import_component_classes(Path(tmp), components, args)
        for family, component in components:
            if cpu:
                found = _in_child(_measure_as_dicts, family, component, tmp, args)
                rows += [Row(**row) for row in found]
            else:
                rows += measure_component(family, component, Path(tmp), args)
    print_table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
