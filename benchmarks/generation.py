"""One demo generation through the server's REST API against diffusers' pipeline called directly, in one run.

The server side is the documented example graph (docs/examples/sd_text_to_image.json: SD, 20 steps at 64x64;
docs/examples/krea2_text_to_image.json: Krea-2, 8 steps), timed from sending the enqueue request to receiving the
item's `completed` event; it includes the HTTP round trip, the queue, every node, the tensor store and writing the
PNG. The direct side is StableDiffusionPipeline / Krea2Pipeline in this process on the same model folders (the
records the server lists), device, dtype, prompts, seed, size and steps. Both run once to warm up (models loaded,
kernels chosen), then run in pairs, each side first in every other pair. The ratio judged against the target is the
median of the pairs' ratios: a pair's two runs are a second apart, so load drifting on a shared machine touches both.
The medians, their ratio and the minimums are printed beside it, and how long the item itself ran (completed_at -
started_at: the nodes, without HTTP and the event stream).

By default a fresh `invokeai-web` is started (it installs the demo models) and stopped at the end; --url uses a
running one on this machine instead. Needs the test extra (httpx, httpx-sse): pip install -e '.[test]'.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from _server import free_port, start_server, stop_server, wait_up
from httpx_sse import connect_sse

QUEUE = "/api/v1/queue/default"
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
TARGET = 1.05


class Completions:
    """Reads the event stream on a thread and wakes whoever waits for an item to finish."""

    def __init__(self, client: httpx.Client) -> None:
        self.finished: dict[int, tuple[float, str]] = {}
        self._changed = threading.Condition()
        ready = threading.Event()
        threading.Thread(target=self._read, args=(client, ready), daemon=True).start()
        if not ready.wait(30):
            sys.exit("could not subscribe to the event stream")

    def _read(self, client: httpx.Client, ready: threading.Event) -> None:
        with connect_sse(client, "GET", f"{QUEUE}/events") as source:
            ready.set()  # the headers are in: subscribed
            for event in source.iter_sse():
                if event.event != "queue_item_status_changed":
                    continue
                payload = json.loads(event.data)
                if payload["status"] in ("completed", "failed", "canceled"):
                    with self._changed:
                        self.finished[payload["item_id"]] = (time.perf_counter(), payload["status"])
                        self._changed.notify_all()

    def wait(self, item_id: int, timeout: float = 600) -> tuple[float, str]:
        with self._changed:
            if not self._changed.wait_for(lambda: item_id in self.finished, timeout):
                sys.exit(f"item {item_id} did not finish within {timeout} s")
            return self.finished[item_id]


def _server_run(client: httpx.Client, completions: Completions, body: dict[str, Any]) -> tuple[float, float]:
    """(enqueue request sent -> completed event received, the item's own completed_at - started_at)."""
    sent = time.perf_counter()
    response = client.post(f"{QUEUE}/enqueue_batch", json=body)
    response.raise_for_status()
    [item_id] = response.json()["item_ids"]
    done, status = completions.wait(item_id)
    item = client.get(f"{QUEUE}/i/{item_id}").json()
    if status != "completed":
        sys.exit(f"the server's item {status}: {item.get('error_message')}")
    ran = datetime.fromisoformat(item["completed_at"]) - datetime.fromisoformat(item["started_at"])
    return done - sent, ran.total_seconds()


def _model_paths(client: httpx.Client) -> dict[str, Path]:
    records = client.get("/api/v2/models/").json()["models"]
    return {record["name"]: Path(record["path"]) for record in records}


def _device_and_dtype(client: httpx.Client) -> tuple[Any, Any]:
    from invokeai.backend.devices import choose_device, choose_dtype

    settings = client.get("/api/v1/app/config").json()["config"]
    device = choose_device(settings["device"])
    return device, choose_dtype(settings["precision"], device)


def _load(path: Path, device: Any, dtype: Any) -> dict[str, Any]:
    from invokeai.backend.models.loaders import components_of, load_component
    from invokeai.backend.models.probe import probe_model

    probe = probe_model(path)
    return {name: load_component(probe, name, device=device, dtype=dtype) for name in components_of(probe)}


def _generator(seed: int) -> Any:
    import torch

    return torch.Generator("cpu").manual_seed(seed)


def _pipeline_run(pipe: Any, graph: dict[str, Any], guidance_field: str) -> Callable[[], Any]:
    """One generation by the diffusers pipeline with the example graph's prompts, size, steps, guidance and seed."""
    nodes = graph["nodes"]
    denoise = nodes["denoise"]
    pipe.set_progress_bar_config(disable=True)
    return lambda: pipe(
        nodes["positive"]["prompt"],
        negative_prompt=nodes["negative"]["prompt"],
        width=denoise["width"],
        height=denoise["height"],
        num_inference_steps=denoise["steps"],
        guidance_scale=denoise[guidance_field],
        generator=_generator(denoise["seed"]),
    ).images[0]


def sd_direct(path: Path, graph: dict[str, Any], device: Any, dtype: Any) -> Callable[[], Any]:
    from diffusers import StableDiffusionPipeline

    from invokeai.backend.models import sd1 as sd1_family

    parts = _load(path, device, dtype)
    nodes = graph["nodes"]
    denoise = nodes["denoise"]
    pipe = StableDiffusionPipeline(
        vae=parts["vae"],
        text_encoder=parts["text_encoder"],
        tokenizer=parts["tokenizer"],
        unet=parts["unet"],
        scheduler=sd1_family.make_scheduler(denoise["scheduler"], dict(parts["scheduler"].config)),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return _pipeline_run(pipe, graph, guidance_field="cfg_scale")


def krea2_direct(path: Path, graph: dict[str, Any], device: Any, dtype: Any) -> Callable[[], Any]:
    from diffusers import Krea2Pipeline

    from invokeai.backend.generation.krea2 import Krea2Settings

    parts = _load(path, device, dtype)
    settings = Krea2Settings.from_model_index(json.loads((path / "model_index.json").read_text(encoding="utf-8")))
    pipe = Krea2Pipeline(**parts, text_encoder_select_layers=settings.select_layers)
    return _pipeline_run(pipe, graph, guidance_field="guidance_scale")


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compare(
    label: str,
    body: dict[str, Any],
    direct: Callable[[], Any],
    client: httpx.Client,
    completions: Completions,
    device: Any,
    repeats: int,
) -> float:
    """Times both sides `repeats` times in pairs and prints the figures; returns the median of the pairs' ratios."""

    def timed_direct() -> float:
        started = time.perf_counter()
        direct()
        _sync(device)
        return time.perf_counter() - started

    _server_run(client, completions, body)
    timed_direct()
    server_times, processing_times, direct_times = [], [], []
    for round_number in range(repeats):
        # Each side goes first in every other pair, so whatever the first run of a pair pays, both pay equally.
        if round_number % 2:
            direct_times.append(timed_direct())
        round_trip, processing = _server_run(client, completions, body)
        server_times.append(round_trip)
        processing_times.append(processing)
        if not round_number % 2:
            direct_times.append(timed_direct())
    server, pipeline = statistics.median(server_times), statistics.median(direct_times)
    # The two runs of a pair are a second apart; the machine's load drifts more than that between pairs.
    paired = statistics.median(s / d for s, d in zip(server_times, direct_times, strict=True))
    fastest_server, fastest_direct = min(server_times), min(direct_times)
    processing = statistics.median(processing_times)
    print(
        f"{label}: server {server * 1000:.1f} ms, direct pipeline {pipeline * 1000:.1f} ms (medians); "
        f"ratio {paired:.3f} (median of the {repeats} pairs; of the medians {server / pipeline:.3f}, "
        f"of the minimums {fastest_server * 1000:.1f} / {fastest_direct * 1000:.1f} ms = "
        f"{fastest_server / fastest_direct:.3f}); the item itself ran {processing * 1000:.1f} ms"
    )
    return paired


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server on this machine (default: start a fresh one)")
    parser.add_argument("--repeats", type=int, default=15, help="timed pairs after one warm-up (default 15)")
    parser.add_argument("--only", choices=("sd", "krea2"), help="run one family only")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads on both sides (default: torch's choice). The two processes take turns, and on a "
        "machine with few cores the idle one's OpenMP workers spin on the cores the busy one needs: use 1 there",
    )
    args = parser.parse_args()
    from invokeai.app.logging_setup import configure_logging, route_ml_library_logging

    configure_logging("warning")
    route_ml_library_logging()  # no loading bars or import notices between the figures
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)

    root = None
    process = None
    if args.url:
        base = args.url.rstrip("/")
    else:
        root = Path(tempfile.mkdtemp(prefix="invokeai-bench-"))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        process = start_server(root, port, args.threads)
    try:
        wait_up(base, process, timeout=300)
        with httpx.Client(base_url=base, timeout=60) as client, httpx.Client(base_url=base, timeout=None) as stream:
            completions = Completions(stream)
            paths = _model_paths(client)
            device, dtype = _device_and_dtype(client)
            print(f"device {device}, dtype {dtype}, {_threads()} CPU threads here, {args.repeats} timed runs per side")
            cases = [
                ("sd", "SD-1 demo, 20 steps at 64x64", "sd_text_to_image", "demo-sd1", sd_direct),
                ("krea2", "Krea-2 demo, 8 steps at 64x64", "krea2_text_to_image", "demo-krea2", krea2_direct),
            ]
            ratios = []
            for family, label, example, model, direct in cases:
                if args.only not in (None, family):
                    continue
                body = json.loads((EXAMPLES / f"{example}.json").read_text(encoding="utf-8"))
                pipeline = direct(paths[model], body["batch"]["graph"], device, dtype)
                ratios.append(compare(label, body, pipeline, client, completions, device, args.repeats))
            verdict = "within" if max(ratios) <= TARGET else "over"
            print(f"worst ratio {max(ratios):.3f}: {verdict} the {TARGET} target")
    finally:
        if process is not None:
            stop_server(process)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
