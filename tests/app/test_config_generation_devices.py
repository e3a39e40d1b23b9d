"""generation_devices: auto or a list of cpu, mps, cuda:N; a GPU listed twice and a bad entry are refused as bad
values, a CUDA index this machine lacks at startup; both end the start with exit code 2."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from invokeai.app.config import CliArgs, ConfigError, load_config
from invokeai.app.config.machine import check_machine
from invokeai.backend.devices import choose_generation_devices, worker_names

Run = Callable[..., subprocess.CompletedProcess[str]]
MISSING_CUDA = f"cuda:{max(torch.cuda.device_count(), 7)}"


def problems_of(root: Path, yaml_text: str) -> list[str]:
    (root / "invokeai.yaml").write_text(yaml_text)
    with pytest.raises(ConfigError) as caught:
        check_machine(load_config(CliArgs(root=root)))
    return caught.value.problems


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("[gpu]", "'gpu' is not a generation device"),
        ("[cuda]", "'cuda' is not a generation device"),
        ("[]", "an empty list names no device"),
        ("[cuda:0, cuda:1, cuda:0]", "cuda:0 is listed more than once; only cpu may repeat"),
        ("7", "not a list"),
    ],
)
def test_a_bad_value_is_refused_saying_what_is_allowed(tmp_path: Path, value: str, why: str) -> None:
    [problem] = problems_of(tmp_path, f"generation_devices: {value}\n")
    assert "'generation_devices'" in problem and why in problem
    assert "cpu, mps, cuda:N" in problem or "only cpu may repeat" in problem


def test_cpu_may_repeat_and_auto_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "invokeai.yaml").write_text("generation_devices: [cpu, CPU]\n")
    assert load_config(CliArgs(root=tmp_path)).config.generation_devices == ["cpu", "cpu"]
    monkeypatch.setenv("INVOKEAI_GENERATION_DEVICES", "auto")
    assert load_config(CliArgs(root=tmp_path)).config.generation_devices == "auto"
    monkeypatch.setenv("INVOKEAI_GENERATION_DEVICES", "cpu,cpu,cpu")
    assert load_config(CliArgs(root=tmp_path)).config.generation_devices == ["cpu"] * 3


def test_a_cuda_index_this_machine_lacks_is_refused_at_startup(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path, f"generation_devices: [cpu, {MISSING_CUDA}]\n")
    assert problem.startswith(f"{tmp_path / 'invokeai.yaml'}: 'generation_devices' is ['cpu', '{MISSING_CUDA}'];")
    assert f"device {MISSING_CUDA!r}" in problem


def test_auto_without_cuda_is_one_worker_on_the_device_setting() -> None:
    if torch.cuda.is_available():
        assert choose_generation_devices("auto", "cpu") == [
            torch.device("cuda", i) for i in range(torch.cuda.device_count())
        ]
    else:
        assert choose_generation_devices("auto", "cpu") == [torch.device("cpu")]


def test_workers_are_named_by_device_and_numbered_where_they_share_one() -> None:
    assert worker_names([torch.device("cpu"), torch.device("cpu")]) == ["cpu#0", "cpu#1"]
    assert worker_names([torch.device("cuda", 1), torch.device("cuda", 0)]) == ["cuda:1", "cuda:0"]


def test_console_script_exits_2_for_a_missing_cuda_index(tmp_path: Path, run_invokeai_web: Run) -> None:
    (tmp_path / "invokeai.yaml").write_text(f"generation_devices: [{MISSING_CUDA}]\n")
    result = run_invokeai_web("--root", str(tmp_path), "--port", "0", env={"INVOKEAI_INSTALL_DEMO_MODELS": "false"})
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert result.stderr.splitlines()[-1].startswith(
        f"invokeai-web: error: {tmp_path / 'invokeai.yaml'}: 'generation_devices' is ['{MISSING_CUDA}']; "
    )


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA device")
def test_cuda_auto_is_every_gpu_and_a_present_index_passes(tmp_path: Path) -> None:
    (tmp_path / "invokeai.yaml").write_text("generation_devices: [cuda:0]\n")
    check_machine(load_config(CliArgs(root=tmp_path)))
    assert worker_names(choose_generation_devices("auto", "auto")) == [
        f"cuda:{i}" for i in range(torch.cuda.device_count())
    ]
