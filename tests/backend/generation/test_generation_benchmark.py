"""benchmarks/krea2_steps.py: without CUDA it exits cleanly, and its whole path runs on a tiny transformer (--smoke),
so a GPU session spends its time measuring, not debugging the script."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from invokeai.backend.attention import attention_stats
from invokeai.backend.families.krea2.generation import WINDOW_ENV

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "krea2_steps.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SCRIPT.parent))  # the script imports its sibling _random_models
        spec = importlib.util.spec_from_file_location("krea2_steps_benchmark", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        patch.setitem(sys.modules, spec.name, module)  # its dataclasses resolve annotations through sys.modules
        spec.loader.exec_module(module)
        yield module


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_without_cuda_it_says_so_and_exits_0(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main([]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_the_smoke_run_covers_every_mode(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(WINDOW_ENV, "flash")  # whatever the caller had is restored afterwards
    original_sdpa = F.scaled_dot_product_attention
    out = tmp_path / "result.json"
    args = ["--smoke", "--sizes", "32", "--steps", "2", "--runs", "1", "--warmups", "1"]
    assert bench.main([*args, "--text-tokens", "8", "--valid-tokens", "3", "--json", str(out)]) == 0

    printed = capsys.readouterr().out
    assert "32x32" in printed and "median step ms" in printed
    results = {row["mode"]: row for row in json.loads(out.read_text())["sizes"]["32"]}
    assert list(results) == ["unset", "efficient", "cudnn", "flash", "priority-cudnn"]
    for mode in ("unset", "flash", "priority-cudnn"):
        assert results[mode]["error"] is None
        assert [len(run) for run in results[mode]["step_seconds"]] == [2]
        # 2 steps x 2 guidance calls x 6 attention calls, all served (the CPU's flash kernel).
        assert sum(results[mode]["kernels"].values()) == 24
    # The CPU has neither kernel: an exclusive window fails visibly and is reported, not hidden.
    for mode in ("efficient", "cudnn"):
        assert results[mode]["error"] and results[mode]["step_seconds"] == []
    assert os.environ[WINDOW_ENV] == "flash"
    assert not attention_stats().installed and F.scaled_dot_product_attention is original_sdpa


def test_the_transformer_is_built_without_initialising_on_another_device(bench: ModuleType) -> None:
    transformer = bench.build_transformer(torch.device("cpu"), torch.bfloat16, bench.SMOKE_CONFIG)
    dtypes = {name: p.dtype for name, p in transformer.named_parameters()}
    assert dtypes["transformer_blocks.0.attn.to_q.weight"] == torch.bfloat16
    # As diffusers loads it: the RMSNorm scales stay float32 (their forward adds 1 in float32).
    assert dtypes["transformer_blocks.0.norm1.weight"] == torch.float32
    assert all(p.device.type == "cpu" for p in transformer.parameters())
    assert all(torch.isfinite(p.float()).all() for p in transformer.parameters())
