"""A throwaway `invokeai-web` for the benchmarks that measure through the REST API: a free port, the server started
on a fresh root (the environment's INVOKEAI_* settings left out), waiting until it answers, and stopping it.

The benchmarks are run as `python benchmarks/NAME.py`, so this folder is sys.path[0] and they import it as `_server`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx


def uncached(graph: dict[str, Any]) -> dict[str, Any]:
    """`graph` with `use_cache: false` on every node. The benchmarks enqueue the same graph again and again, which the
    invocation cache (node_cache_size, on by default as InvokeAI's) would answer without running the nodes: a
    generation measured so would be the cache's speed, not the model's."""
    for node in graph["nodes"].values():
        node["use_cache"] = False
    return graph


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(root: Path, port: int, threads: int | None = None) -> subprocess.Popen[bytes]:
    """`invokeai-web` on `root` and `port`, quiet; with `threads`, OMP_NUM_THREADS set to it."""
    executable = Path(sys.executable).with_name("invokeai-web")
    found = str(executable) if executable.exists() else shutil.which("invokeai-web")
    if found is None:
        sys.exit("invokeai-web is not installed: pip install -e '.[test]'")
    env = {name: value for name, value in os.environ.items() if not name.upper().startswith("INVOKEAI_")}
    env.update(HF_HUB_OFFLINE="1", INVOKEAI_LOG_LEVEL="warning")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return subprocess.Popen(
        [found, "--root", str(root), "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )


def wait_up(base: str, process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """Return once the server at `base` answers; exit if `process` (when given) ends or `timeout` s pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            sys.exit(f"invokeai-web exited with {process.returncode}")
        try:
            httpx.get(f"{base}/api/v1/app/version", timeout=5)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    sys.exit(f"invokeai-web did not answer within {timeout:g} s")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and a kill if it has not exited 30 s later."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
