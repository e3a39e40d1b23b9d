"""The calibration script on this CPU: every demo component's estimate is at least its measured peak and at most
1.3 times it (the bound the activation factors were tuned to), and the table carries its fingerprint."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from invokeai.backend.families import FAMILIES

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "calibrate_working_memory.py"


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/proc/self/clear_refs"),
    reason="the CPU peak is read from Linux's /proc",
)
def test_estimates_bound_the_measured_cpu_peak_within_30_percent() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--sizes", "128", "--repeats", "1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("# device=cpu") and "attention_backend=auto" in lines[0] and "torch=" in lines[0]
    rows = [line.split() for line in lines[2:]]
    # One row per operation of every registered family.
    assert {(row[0], row[1]) for row in rows} == {(f.name, op) for f in FAMILIES for op in f.runs}
    for row in rows:
        estimate, measured = float(row[5]), float(row[6])
        assert measured > 1.0, row  # MiB: large enough for the RSS counters to resolve
        assert 1.0 <= estimate / measured <= 1.3, row


def test_full_size_option_measures_sd15_at_256_and_512_once_each() -> None:
    """The full-size run is a calibration (minutes, ~2 GB of weights), not a test: only its options are checked."""
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports its sibling _forked
    try:
        spec = importlib.util.spec_from_file_location("calibrate_working_memory", SCRIPT)
        assert spec is not None and spec.loader is not None
        script = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = script  # its dataclass looks its module up there
        spec.loader.exec_module(script)
    finally:
        sys.path.remove(str(SCRIPT.parent))
        sys.modules.pop("calibrate_working_memory", None)
    full = script.parse_args(["--full-size", "--components", "unet,vae_encode"])
    assert full.full_size and full.sizes == [256, 512] and full.repeats == 1
    assert full.components == ["unet", "vae_encode"]
    demo = script.parse_args([])
    assert not demo.full_size and demo.sizes == [64, 128, 256] and demo.repeats == 5 and demo.components is None
