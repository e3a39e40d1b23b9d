"""This server against InvokeAI 6.14.2 itself, on the same small SD-1 model, the same text-to-image, the same machine.

Opt-in: it needs PyPI, and takes minutes. It is not part of the test command, and `--help` installs nothing.

What it does:
- installs InvokeAI 6.14.2 into a scratch venv (`--venv`, kept for the next run): `pip install torch==2.13.0`, then
  `pip install invokeai==6.14.2 torch==2.13.0` (torch named again, or pip would replace it with the newest CUDA
  build). Workaround: the torchvision that pip then picks (0.28.0) is a CUDA build whose import fails on CPU torch
  with "operator torchvision::nms does not exist"; its two `register_fake` decorators (nms, qnms) are removed from
  the installed torchvision/_meta_registrations.py in the scratch venv. InvokeAI never runs those operators here.
- builds a small random-weight SD-1 pipeline that InvokeAI's probe accepts: the demo SD-1 model with SD-1's
  cross-attention width and CLIP text width (768; the demo's 32 is refused as an unknown base);
- installs it (in place) on both servers through their model install API, and runs the same text-to-image on each:
  InvokeAI's graph (main_model_loader, compel x2, noise, denoise_latents, l2i) and this server's
  (sd_text_encoder x2, sd_denoise, sd_vae_decode), 20 euler steps at 64x64, cfg 7.5, every node use_cache false;
- in interleaved rounds (this server, then InvokeAI, each round), both with one torch thread (OMP_NUM_THREADS=1):
  a fresh start (time until GET /api/v1/app/version answers), the model install, a restart on the same root, the
  first item after the restart (enqueued the moment the server answers), `--items` more items (median), and the
  resident memory (RSS of the server process after its items);
- prints the ratios this/InvokeAI per measure (median of the rounds), with the targets: per item <= 0.6x,
  start <= 0.5x, memory <= 0.75x, first item after a restart <= 1.0x.

    python benchmarks/against_invokeai.py [--rounds 3] [--items 5] [--venv /tmp/against-invokeai/venv]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RELEASE = "invokeai==6.14.2"
TORCH = "torch==2.13.0"
STEPS, SIZE, CFG, SEED = 20, 64, 7.5, 42
PROMPT, NEGATIVE = "a lighthouse on a rocky cliff at sunset, oil painting", "blurry, low quality"
TARGETS = {"per item": 0.6, "fresh start": 0.5, "restart": 0.5, "first item after restart": 1.0, "memory (RSS)": 0.75}
QUEUE = "/api/v1/queue/default"


# --- the scratch InvokeAI ----------------------------------------------------------------------------------------


def install_invokeai(venv: Path) -> Path:
    """The scratch venv's invokeai-web, installing InvokeAI 6.14.2 there first if it is not."""
    executable = venv / "bin" / "invokeai-web"
    if not executable.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, TORCH], check=True)
        subprocess.run([*pip, RELEASE, TORCH], check=True)
    patch_torchvision(venv)
    return executable


def patch_torchvision(venv: Path) -> None:
    """The documented workaround: drop torchvision's fake-kernel registrations for nms and qnms, which fail to
    import on a CPU torch that lacks the operators (a CUDA torchvision build)."""
    [meta] = venv.glob("lib/python*/site-packages/torchvision/_meta_registrations.py")
    text = meta.read_text()
    patched = re.sub(r'^@torch\.library\.register_fake\("torchvision::q?nms"\)\n', "", text, flags=re.M)
    if patched != text:
        meta.write_text(patched)


# --- the model ---------------------------------------------------------------------------------------------------


def build_model(folder: Path) -> Path:
    """The demo SD-1 pipeline at SD-1's widths: 768 for the UNet's cross-attention and the CLIP text encoder."""
    import torch

    from invokeai.backend.families.sd1.demo import SD1_TEXT, SD1_UNET, build_sd1_pipeline

    torch.set_num_threads(1)
    path = folder / "sd1-768"
    unet = {**SD1_UNET, "cross_attention_dim": 768, "attention_head_dim": 8}
    text = {**SD1_TEXT, "hidden_size": 768, "intermediate_size": 1536, "num_attention_heads": 12, "projection_dim": 768}
    build_sd1_pipeline(unet, text).save_pretrained(path, safe_serialization=True)
    return path


# --- the graphs --------------------------------------------------------------------------------------------------


def invokeai_graph(model: dict[str, Any]) -> dict[str, Any]:
    identifier = {key: model.get(key) for key in ("key", "hash", "name", "base", "type")}
    nodes = {
        "loader": {"type": "main_model_loader", "model": identifier},
        "positive": {"type": "compel", "prompt": PROMPT},
        "negative": {"type": "compel", "prompt": NEGATIVE},
        "noise": {"type": "noise", "seed": SEED, "width": SIZE, "height": SIZE, "use_cpu": True},
        "denoise": {
            "type": "denoise_latents",
            "steps": STEPS,
            "cfg_scale": CFG,
            "scheduler": "euler",
            "denoising_start": 0.0,
            "denoising_end": 1.0,
        },
        "decode": {"type": "l2i", "fp32": True},
    }
    edges = [
        ("loader", "clip", "positive", "clip"),
        ("loader", "clip", "negative", "clip"),
        ("loader", "unet", "denoise", "unet"),
        ("loader", "vae", "decode", "vae"),
        ("positive", "conditioning", "denoise", "positive_conditioning"),
        ("negative", "conditioning", "denoise", "negative_conditioning"),
        ("noise", "noise", "denoise", "noise"),
        ("denoise", "latents", "decode", "latents"),
    ]
    return batch("invokeai_sd1", nodes, edges)


def this_graph(model: dict[str, Any]) -> dict[str, Any]:
    named = {"key": model["key"]}
    nodes = {
        "positive": {"type": "sd_text_encoder", "model": named, "prompt": PROMPT},
        "negative": {"type": "sd_text_encoder", "model": named, "prompt": NEGATIVE},
        "denoise": {
            "type": "sd_denoise",
            "model": named,
            "width": SIZE,
            "height": SIZE,
            "steps": STEPS,
            "cfg_scale": CFG,
            "scheduler": "euler",
            "seed": SEED,
        },
        "decode": {"type": "sd_vae_decode", "model": named},
    }
    edges = [
        ("positive", "conditioning", "denoise", "positive_conditioning"),
        ("negative", "conditioning", "denoise", "negative_conditioning"),
        ("denoise", "latents", "decode", "latents"),
    ]
    return batch("this_sd1", nodes, edges)


def batch(graph_id: str, nodes: dict[str, dict[str, Any]], edges: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    # use_cache false everywhere: the same item is enqueued again and again, and the invocation cache (on in both
    # servers by default) would answer it without running it.
    graph = {
        "id": graph_id,
        "nodes": {node_id: {"id": node_id, "use_cache": False, **node} for node_id, node in nodes.items()},
        "edges": [
            {"source": {"node_id": a, "field": af}, "destination": {"node_id": b, "field": bf}}
            for a, af, b, bf in edges
        ],
    }
    return {"batch": {"graph": graph, "runs": 1}}


# --- a server ------------------------------------------------------------------------------------------------------


@dataclass
class Side:
    name: str
    executable: Path
    graph: Callable[[dict[str, Any]], dict[str, Any]]
    env: dict[str, str]
    figures: dict[str, list[float]] = field(default_factory=dict)

    def add(self, measure: str, value: float) -> None:
        self.figures.setdefault(measure, []).append(value)


def rss_bytes(pid: int) -> int:
    """Resident memory of the process and its children (Linux /proc)."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(child) for child in children.read_text().split()]
    for each in pids:
        status = Path(f"/proc/{each}/status")
        if status.exists():
            match = re.search(r"^VmRSS:\s+(\d+) kB", status.read_text(), re.M)
            total += int(match.group(1)) * 1024 if match else 0
    return total


class Running:
    def __init__(self, side: Side, root: Path, port: int, log: Path) -> None:
        import httpx

        self.base = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("INVOKEAI_")}
        env.update(side.env, INVOKEAI_PORT=str(port), INVOKEAI_HOST="127.0.0.1", OMP_NUM_THREADS="1")
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        self.started = time.perf_counter()
        with open(log, "a") as out:
            self.process = subprocess.Popen(
                [str(side.executable), "--root", str(root)], stdout=out, stderr=subprocess.STDOUT, env=env
            )
        self.client = httpx.Client(base_url=self.base, timeout=120)

    def up(self, timeout: float = 600) -> float:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"{self.base}: the server exited with {self.process.returncode}")
            try:
                self.client.get("/api/v1/app/version", timeout=5).raise_for_status()
                return time.perf_counter() - self.started
            except httpx.HTTPError:
                time.sleep(0.05)
        sys.exit(f"{self.base} did not answer within {timeout:g} s")

    def install(self, source: Path) -> dict[str, Any]:
        params = {"source": str(source), "inplace": "true"}
        response = self.client.post("/api/v2/models/install", params=params, json={})
        response.raise_for_status()
        job_id = response.json()["id"]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            job = self.client.get(f"/api/v2/models/install/{job_id}").json()
            if job["status"] in ("completed", "error", "cancelled"):
                break
            time.sleep(0.2)
        if job["status"] != "completed":
            sys.exit(f"{self.base}: the install ended {job['status']}: {job.get('error')}")
        return self.model(source.name)

    def model(self, name: str) -> dict[str, Any]:
        models = self.client.get("/api/v2/models/").json()["models"]
        return next(model for model in models if model["name"] == name)

    def item(self, body: dict[str, Any]) -> float:
        started = time.perf_counter()
        response = self.client.post(f"{QUEUE}/enqueue_batch", json=body)
        if response.status_code != 200:
            sys.exit(f"{self.base}: enqueue refused ({response.status_code}): {response.text[:600]}")
        item_id = response.json()["item_ids"][0]
        while True:
            item = self.client.get(f"{QUEUE}/i/{item_id}").json()
            if item["status"] == "completed":
                return time.perf_counter() - started
            if item["status"] in ("failed", "canceled"):
                sys.exit(f"{self.base}: item {item_id} {item['status']}: {item.get('error_message')}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def one_round(side: Side, model_path: Path, work: Path, items: int, port: int) -> None:
    """A fresh root: start, install, stop; restart; the first item at once, then `items` more; the RSS."""
    root = work / f"{side.name}-root-{len(side.figures.get('fresh start', []))}"
    log = work / f"{side.name}.log"
    server = Running(side, root, port, log)
    try:
        side.add("fresh start", server.up())
        model = server.install(model_path)
    finally:
        server.stop()
    server = Running(side, root, port, log)
    try:
        side.add("restart", server.up())
        body = side.graph(model)
        side.add("first item after restart", server.item(body))
        side.add("per item", statistics.median(server.item(body) for _ in range(items)))
        side.add("memory (RSS)", rss_bytes(server.process.pid) / 2**20)
    finally:
        server.stop()
    shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--items", type=int, default=5, help="warm items per round; their median counts (default 5)")
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "against-invokeai" / "venv")
    parser.add_argument("--port", type=int, default=19090, help="the port both servers take in turn")
    args = parser.parse_args()

    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", args.port)) == 0:
            sys.exit(f"port {args.port} is taken: pass --port")
    this_executable = Path(sys.executable).with_name("invokeai-web")
    if not this_executable.exists():
        sys.exit("invokeai-web is not installed beside this python: pip install -e '.[test]'")
    invokeai_executable = install_invokeai(args.venv)
    work = Path(tempfile.mkdtemp(prefix="against-invokeai-"))
    model_path = build_model(work)
    sides = [
        # This server's demo models are not wanted here: the same one model on both sides.
        Side("this", this_executable, this_graph, {"INVOKEAI_INSTALL_DEMO_MODELS": "false"}),
        Side("InvokeAI", invokeai_executable, invokeai_graph, {}),
    ]
    for number in range(args.rounds):
        for side in sides:
            one_round(side, model_path, work, args.items, args.port)
            latest = {measure: round(values[-1], 2) for measure, values in side.figures.items()}
            print(f"round {number + 1} {side.name}: {json.dumps(latest)}", flush=True)
    this, invokeai = sides
    print()
    print("| measure | this server | InvokeAI 6.14.2 | this/InvokeAI | target |")
    print("|---|---:|---:|---:|---:|")
    for measure, target in TARGETS.items():
        mine, theirs = statistics.median(this.figures[measure]), statistics.median(invokeai.figures[measure])
        unit = "MB" if "memory" in measure else "s"
        ratio = mine / theirs
        verdict = "holds" if ratio <= target else "over"
        print(f"| {measure} | {mine:.2f} {unit} | {theirs:.2f} {unit} | {ratio:.2f}x | <= {target:g}x ({verdict}) |")
    print(f"\n(medians of {args.rounds} interleaved rounds, one torch thread each; logs under {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
