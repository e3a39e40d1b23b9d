"""One demo generation through the server's REST API against diffusers' pipeline called directly, in one run, for
every registered model family.

The server side is the family's documented text-to-image example graph on its demo pipeline (the
docs/examples/*.json whose denoise node is the family's and names the family's first pipeline demo model: for
SD-1, 20 steps at 64x64; Krea-2 and SDXL, 8 steps; Qwen-Image, 50 steps of true CFG; FLUX.1, run with 20 steps,
see STEPS), timed from sending the enqueue request to receiving the item's `completed` event; it includes the HTTP
round trip, the queue, every node, the tensor store and writing the PNG. Like the pipeline called without a step
callback, the client takes no step previews: its event stream names only `queue_item_status_changed`, and the server
makes no preview nobody watches.
The direct side is the pipeline class the demo's model_index.json names, in a process of its own, on the same model
folders (the records the server lists), device, dtype, prompts, seed, size, steps and sampler.

Two copies of the same program in two processes can differ by several percent for the whole of their lives (where
their memory landed), and pairing runs in time does not remove that. So the benchmark runs in rounds: each round
starts a fresh server and a fresh pipeline process, runs each side once to warm up (models loaded, kernels chosen),
then times them in pairs, each side first in every other pair. The ratio judged against the target is the median of
all pairs' ratios over all rounds, with a 95% bootstrap interval over the rounds: the verdict is "within" or "over"
only when the whole interval is on one side of the target. Each round's own ratio, the medians and the minimums are
printed beside it, and how long the item itself ran (completed_at - started_at: the nodes, without HTTP and the
event stream). Each round also times an item of one cheap node (a 64x64 blank image): the server's fixed cost per
item (HTTP, queue, SQLite, events, one PNG), which the demo generations, a few hundred ms on a CPU, pay in full.

By default the servers run on a fresh root (the first one installs the demo models) that is deleted at the end;
--url uses a running server on this machine instead, for every round. Needs the test extra (httpx, httpx-sse):
pip install -e '.[test]'.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
from _server import free_port, start_server, stop_server, uncached, wait_up
from httpx_sse import connect_sse

QUEUE = "/api/v1/queue/default"
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
TARGET = 1.05


@dataclass(frozen=True)
class Case:
    family: str
    label: str
    example: str
    model: str
    guidance_field: str
    guidance_offset: float  # the pipeline's guidance_scale less the node's (GraphFacts.pipeline_guidance_offset)
    guidance_argument: str = "guidance_scale"  # the pipeline's argument for it (GraphFacts.pipeline_guidance_argument)
    steps: int | None = None  # None: the example's
    steps_field: str = "steps"  # the denoise node's step count (GraphFacts.steps_field: FLUX.1's is num_steps)

    @property
    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads((EXAMPLES / f"{self.example}.json").read_text(encoding="utf-8"))
        if self.steps is not None:
            body["batch"]["graph"]["nodes"]["denoise"][self.steps_field] = self.steps
        uncached(body["batch"]["graph"])
        return body


# A family whose example takes too little time for the server's fixed cost around its nodes to be a small part runs
# with more steps: FLUX.1's 8 steps take about 115 ms here, where the ~10 ms a graph of four nodes costs the server
# (the queue, events, results) would be 9%; 20 steps, as SD-1's example has, measure the generation.
STEPS = {"flux": 20}


def _text_to_image_example(family: Any, model: str) -> str:
    """The documented text-to-image example of `family` on the demo model `model`."""
    # The node that names the model: the denoise node, or the family's loader where its nodes take one.
    naming = family.graph.loader or family.graph.denoise
    for path in sorted(EXAMPLES.glob("*.json")):
        nodes = json.loads(path.read_text(encoding="utf-8"))["batch"]["graph"]["nodes"]
        types = [node["type"] for node in nodes.values()]
        named = [node.get("model", {}).get("name") for node in nodes.values() if node["type"] == naming]
        if family.graph.denoise in types and named == [model] and family.graph.encode not in types:
            return path.stem
    raise LookupError(f"docs/examples has no text-to-image example of the {family.name} family on {model}")


def _cases() -> tuple[Case, ...]:
    """One case per registered family: its example on its first pipeline demo model."""
    from invokeai.backend.families.registry import FAMILIES

    cases = []
    for family in FAMILIES:
        demo = next(demo for demo in family.demos if demo.type == "main")
        example = _text_to_image_example(family, demo.name)
        steps = STEPS.get(family.name)
        denoise = json.loads((EXAMPLES / f"{example}.json").read_text(encoding="utf-8"))["batch"]["graph"]["nodes"]
        shown = steps or denoise["denoise"][family.graph.steps_field]
        size = f"{denoise['denoise']['width']}x{denoise['denoise']['height']}"
        label = f"{family.title} demo, {shown} steps at {size}"
        cases.append(
            Case(
                family.name,
                label,
                example,
                demo.name,
                family.graph.guidance_field,
                family.graph.pipeline_guidance_offset,
                steps=steps,
                steps_field=family.graph.steps_field,
                guidance_argument=family.graph.pipeline_guidance_argument,
            )
        )
    return tuple(cases)


CASES = _cases()

FIXED_COST_BODY: dict[str, Any] = {
    "batch": {
        "graph": {
            "id": "fixed_cost",
            "nodes": {"blank": {"id": "blank", "type": "blank_image", "width": 64, "height": 64}},
        },
        "runs": 1,
    }
}


# The server side.


class Completions:
    """Reads the items' status events on a thread and wakes whoever waits for an item to finish."""

    def __init__(self, client: httpx.Client) -> None:
        self.finished: dict[int, tuple[float, str]] = {}
        self._changed = threading.Condition()
        ready = threading.Event()
        threading.Thread(target=self._read, args=(client, ready), daemon=True).start()
        if not ready.wait(30):
            sys.exit("could not subscribe to the event stream")

    def _read(self, client: httpx.Client, ready: threading.Event) -> None:
        try:
            params = {"event": "queue_item_status_changed"}
            with connect_sse(client, "GET", f"{QUEUE}/events", params=params) as source:
                ready.set()  # the headers are in: subscribed
                for event in source.iter_sse():
                    payload = json.loads(event.data)
                    if payload["status"] in ("completed", "failed", "canceled"):
                        with self._changed:
                            self.finished[payload["item_id"]] = (time.perf_counter(), payload["status"])
                            self._changed.notify_all()
        except httpx.TransportError:
            pass  # the round's server stopped

    def wait(self, item_id: int, timeout: float = 600) -> tuple[float, str]:
        with self._changed:
            if not self._changed.wait_for(lambda: item_id in self.finished, timeout):
                sys.exit(f"item {item_id} did not finish within {timeout} s")
            return self.finished[item_id]


@dataclass
class Server:
    client: httpx.Client
    completions: Completions

    def run(self, body: dict[str, Any]) -> tuple[float, float]:
        """(enqueue request sent -> completed event received, the item's own completed_at - started_at)."""
        sent = time.perf_counter()
        response = self.client.post(f"{QUEUE}/enqueue_batch", json=body)
        response.raise_for_status()
        [item_id] = response.json()["item_ids"]
        done, status = self.completions.wait(item_id)
        item = self.client.get(f"{QUEUE}/i/{item_id}").json()
        if status != "completed":
            sys.exit(f"the server's item {status}: {item.get('error_message')}")
        ran = datetime.fromisoformat(item["completed_at"]) - datetime.fromisoformat(item["started_at"])
        return done - sent, ran.total_seconds()

    def model_paths(self) -> dict[str, str]:
        records = self.client.get("/api/v2/models/").json()["models"]
        return {record["name"]: record["path"] for record in records}

    def settings(self) -> tuple[str, str]:
        config = self.client.get("/api/v1/app/config").json()["config"]
        return config["device"], config["precision"]


@contextmanager
def serving(url: str | None, root: Path, threads: int | None) -> Iterator[Server]:
    """A running server: the one at `url`, or a fresh `invokeai-web` on `root`, stopped afterwards."""
    process = None
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = start_server(root, port, threads)
    try:
        wait_up(url, process, timeout=300)
        with httpx.Client(base_url=url, timeout=60) as client, httpx.Client(base_url=url, timeout=None) as stream:
            yield Server(client, Completions(stream))
    finally:
        if process is not None:
            stop_server(process)


# The direct side: a process of its own that builds the pipelines and times one call per request.


def _load(path: Path, device: Any, dtype: Any) -> dict[str, Any]:
    from invokeai.backend.models.loaders import components_of, load_component
    from invokeai.backend.models.probe import probe_model

    probe = probe_model(path)
    return {name: load_component(probe, name, device=device, dtype=dtype) for name in components_of(probe)}


def _is_component_entry(value: Any) -> bool:
    """A model_index.json entry naming a component's library and class (or two nulls: none)."""
    return isinstance(value, list) and len(value) == 2 and all(x is None or isinstance(x, str) for x in value)


def _pipeline(case: Case, path: Path, device: Any, dtype: Any) -> Any:
    """The pipeline class the folder's model_index.json names, on the server's loaded components, with the example's
    sampler (built as the family's denoise node builds it); the pipeline's other arguments are the folder's
    settings (model_index.json), no optional component (safety checker, image encoder ...) and no watermark."""
    import inspect

    import diffusers

    from invokeai.backend.families.registry import get_family

    parts = _load(path, device, dtype)
    index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
    pipeline_class = getattr(diffusers, index["_class_name"])
    scheduler = case.body["batch"]["graph"]["nodes"]["denoise"].get("scheduler")
    if scheduler is not None:
        parts["scheduler"] = get_family(case.family).make_scheduler(scheduler, dict(parts["scheduler"].config))
    if issubclass(pipeline_class, diffusers.ModularPipeline):
        # A modular pipeline (Anima's) is its default blocks with the components put in; its guider, made from its
        # default config, is set per call (pipeline_call).
        pipe = getattr(diffusers, pipeline_class.default_blocks_name)().init_pipeline()
        pipe.update_components(**parts)
        return pipe
    arguments: dict[str, Any] = {}
    for name, parameter in inspect.signature(pipeline_class.__init__).parameters.items():
        if name == "self" or name in parts or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in index and not _is_component_entry(index[name]):
            arguments[name] = index[name]
        elif parameter.default is inspect.Parameter.empty:
            arguments[name] = None
    for name in ("requires_safety_checker", "add_watermarker"):
        if name in inspect.signature(pipeline_class.__init__).parameters:
            arguments[name] = False
    return pipeline_class(**parts, **arguments)


def pipeline_call(pipe: Any, case: Case) -> Callable[[], Any]:
    """One generation by the diffusers pipeline with the example graph's prompts, size, steps, guidance and seed."""
    import torch

    nodes = case.body["batch"]["graph"]["nodes"]
    denoise = nodes["denoise"]
    pipe.set_progress_bar_config(disable=True)
    # FLUX.1's examples have one prompt node (no negative: its guidance is an embedding); a family whose example
    # runs without guidance has no negative either.
    prompt = {"prompt": (nodes.get("prompt") or nodes["positive"])["prompt"]}
    if "negative" in nodes:
        prompt["negative_prompt"] = nodes["negative"]["prompt"]
    guidance = {case.guidance_argument: denoise[case.guidance_field] + case.guidance_offset}
    generation = {
        "width": denoise["width"],
        "height": denoise["height"],
        "num_inference_steps": denoise[case.steps_field],
    }
    if getattr(pipe, "guider", None) is not None:
        # A modular pipeline takes its guidance as its guider's setting and returns its state: the images are an
        # output to ask for.
        pipe.update_components(guider=type(pipe.guider).from_config(pipe.guider.config, **guidance))
        return lambda: pipe(
            **prompt, **generation, generator=torch.Generator("cpu").manual_seed(denoise["seed"]), output="images"
        )[0]
    return lambda: pipe(
        **prompt,
        **guidance,
        width=denoise["width"],
        height=denoise["height"],
        num_inference_steps=denoise[case.steps_field],
        generator=torch.Generator("cpu").manual_seed(denoise["seed"]),
    ).images[0]


def _direct_process(
    connection: Connection, paths: dict[str, str], device_setting: str, precision: str, threads: int | None
) -> None:
    import torch

    from invokeai.app.logging_setup import configure_logging, route_ml_library_logging
    from invokeai.backend.devices import choose_device, choose_dtype

    configure_logging("warning")
    route_ml_library_logging()
    if threads is not None:
        torch.set_num_threads(threads)
    device = choose_device(device_setting)
    dtype = choose_dtype(precision, device)
    connection.send(f"{device}, {dtype}, {torch.get_num_threads()} CPU threads")
    calls: dict[str, Callable[[], Any]] = {}
    while (request := connection.recv()) is not None:
        case: Case = request
        if case.family not in calls:
            calls[case.family] = pipeline_call(_pipeline(case, Path(paths[case.model]), device, dtype), case)
        started = time.perf_counter()
        calls[case.family]()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        connection.send(time.perf_counter() - started)


@dataclass
class Direct:
    connection: Connection
    description: str

    def run(self, case: Case) -> float:
        self.connection.send(case)
        seconds: float = self.connection.recv()
        return seconds


@contextmanager
def direct_process(server: Server, threads: int | None) -> Iterator[Direct]:
    """A fresh process running the pipelines on the server's model folders, device and precision."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    device, precision = server.settings()
    process = context.Process(target=_direct_process, args=(theirs, server.model_paths(), device, precision, threads))
    process.start()
    try:
        yield Direct(ours, description=ours.recv())
        ours.send(None)
    finally:
        process.join(60)
        if process.is_alive():
            process.kill()


# Timing.


@dataclass
class Figures:
    server: list[float] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)
    processing: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [s / d for s, d in zip(self.server, self.direct, strict=True)]

    def summary(self) -> str:
        server, direct = statistics.median(self.server), statistics.median(self.direct)
        return (
            f"server {server * 1000:.1f} ms, direct pipeline {direct * 1000:.1f} ms (medians); "
            f"ratio {statistics.median(self.ratios):.3f} (median of {len(self.ratios)} pairs; of the medians "
            f"{server / direct:.3f}, of the minimums {min(self.server) * 1000:.1f} / {min(self.direct) * 1000:.1f} ms "
            f"= {min(self.server) / min(self.direct):.3f}); the item itself ran "
            f"{statistics.median(self.processing) * 1000:.1f} ms"
        )


def time_pairs(case: Case, server: Server, direct: Direct, pairs: int) -> Figures:
    body = case.body
    server.run(body)
    direct.run(case)
    figures = Figures()
    for number in range(pairs):
        # Each side goes first in every other pair, so whatever the first run of a pair pays, both pay equally.
        if number % 2:
            figures.direct.append(direct.run(case))
        round_trip, processing = server.run(body)
        figures.server.append(round_trip)
        figures.processing.append(processing)
        if not number % 2:
            figures.direct.append(direct.run(case))
    return figures


def fixed_cost(server: Server, items: int = 12) -> float:
    """The median round trip of a one-node item, after one to warm up."""
    server.run(FIXED_COST_BODY)
    return statistics.median(server.run(FIXED_COST_BODY)[0] for _ in range(items))


def pooled_ratio(rounds: list[list[float]]) -> float:
    """The judged figure: the median of all pairs' ratios, `rounds` holding each round's."""
    return statistics.median(ratio for ratios in rounds for ratio in ratios)


def ratio_interval(rounds: list[list[float]], resamples: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of `pooled_ratio`: rounds drawn with replacement, then pairs within each drawn round,
    because a round's fresh processes shift all its pairs together (the rounds are the independent draws)."""
    draw = random.Random(0)
    estimates = sorted(
        pooled_ratio([draw.choices(ratios, k=len(ratios)) for ratios in draw.choices(rounds, k=len(rounds))])
        for _ in range(resamples)
    )
    return estimates[int(0.025 * resamples)], estimates[int(0.975 * resamples) - 1]


def verdict(low: float, high: float) -> str:
    if high <= TARGET:
        return f"within the {TARGET} target"
    if low > TARGET:
        return f"over the {TARGET} target"
    return f"too close to the {TARGET} target to tell on this machine (more rounds narrow the interval)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server on this machine (default: a fresh one every round)")
    parser.add_argument("--rounds", type=int, default=8, help="fresh server and pipeline process pairs (default 8)")
    parser.add_argument("--pairs", type=int, default=6, help="timed pairs per round and family (default 6)")
    parser.add_argument("--only", choices=[case.family for case in CASES], help="run one family only")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads on both sides (default: torch's choice). The two processes take turns, and on a "
        "machine with few cores the idle one's OpenMP workers spin on the cores the busy one needs: use 1 there",
    )
    args = parser.parse_args()
    cases = [case for case in CASES if args.only in (None, case.family)]
    root = Path(tempfile.mkdtemp(prefix="invokeai-bench-"))
    results: dict[str, list[Figures]] = {case.family: [] for case in cases}
    fixed: list[float] = []
    try:
        for number in range(1, args.rounds + 1):
            with (
                serving(args.url, root, args.threads) as server,
                direct_process(server, args.threads) as direct,
            ):
                if number == 1:
                    print(f"direct side: {direct.description}; {args.rounds} rounds of {args.pairs} pairs per family")
                fixed.append(fixed_cost(server))
                print(f"round {number}: a one-node item's round trip {fixed[-1] * 1000:.1f} ms", flush=True)
                for case in cases:
                    figures = time_pairs(case, server, direct, args.pairs)
                    results[case.family].append(figures)
                    print(f"round {number}, {case.label}: {figures.summary()}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    item_cost = statistics.median(fixed)
    for case in cases:
        rounds = [figures.ratios for figures in results[case.family]]
        low, high = ratio_interval(rounds)
        each = ", ".join(f"{statistics.median(ratios):.3f}" for ratios in rounds)
        print(
            f"{case.label}: ratio {pooled_ratio(rounds):.3f}, 95% interval {low:.3f} to {high:.3f}: "
            f"{verdict(low, high)} (median of all {sum(map(len, rounds))} pairs; the rounds' own: {each})"
        )
        on_server = statistics.median(seconds for figures in results[case.family] for seconds in figures.server)
        print(
            f"  of its {on_server * 1000:.1f} ms on the server, {item_cost * 1000:.1f} ms "
            f"({item_cost / on_server:.1%}) is the fixed cost of an item (a one-node item's round trip)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
