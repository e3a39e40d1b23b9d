"""The device facts the ranking turns on: capability and cuDNN version forms, the platform of a device, and
TORCH_CUDNN_SDPA_DEPRIORITIZED read as PyTorch reads it."""

from __future__ import annotations

import logging

import pytest
import torch

from invokeai.backend import devices
from invokeai.backend.attention.architecture import (
    DEPRIORITIZED_ENV,
    DeviceFacts,
    as_capability,
    as_cudnn_version,
    cudnn_deprioritized,
    cudnn_text,
    device_facts,
)


@pytest.mark.parametrize(
    ("given", "expected"),
    [((9, 0), (9, 0)), (90, (9, 0)), (89, (8, 9)), (100, (10, 0)), (103, (10, 3)), (120, (12, 0)), ((8, 6), (8, 6))],
)
def test_a_capability_is_a_pair_or_major_times_ten_plus_minor(given: object, expected: tuple[int, int]) -> None:
    assert as_capability(given) == expected  # type: ignore[arg-type]


def test_a_capability_below_ten_is_refused_as_ambiguous() -> None:
    with pytest.raises(ValueError, match="major \\* 10 \\+ minor"):
        as_capability(9)


@pytest.mark.parametrize(
    ("given", "expected"),
    [(91600, 91600), ((9, 16, 0), 91600), ((9, 15, 1), 91501), ((9, 15), 91500), ((8, 9, 7), 8907), (None, None)],
)
def test_a_cudnn_version_is_torchs_integer_or_a_tuple(given: object, expected: int | None) -> None:
    assert as_cudnn_version(given) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "text"), [(91600, "9.16.0"), (91501, "9.15.1"), (91000, "9.10.0"), (8907, "8.9.7")]
)
def test_cudnn_versions_read_as_released(version: int, text: str) -> None:
    assert cudnn_text(version) == text


@pytest.mark.parametrize(("value", "deprioritized"), [(None, False), ("0", False), ("1", True)])
def test_the_deprioritized_flag_is_pytorchs_check_env(value: str | None, deprioritized: bool, caplog) -> None:  # type: ignore[no-untyped-def]
    env = {} if value is None else {DEPRIORITIZED_ENV: value}
    with caplog.at_level(logging.WARNING):
        assert cudnn_deprioritized(env) is deprioritized
    assert not caplog.records


@pytest.mark.parametrize("value", ["", "true", "yes", "2", " 1"])
def test_any_other_value_is_ignored_with_a_warning_as_pytorch_does(value: str, caplog) -> None:  # type: ignore[no-untyped-def]
    # c10::utils::check_env: only "1" is true and "0" false; anything else warns and reads as unset, so PyTorch
    # keeps preferring cuDNN.
    with caplog.at_level(logging.WARNING):
        assert cudnn_deprioritized({DEPRIORITIZED_ENV: value}) is False
    assert DEPRIORITIZED_ENV in caplog.text and "0 or 1" in caplog.text


def test_the_flag_is_read_from_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEPRIORITIZED_ENV, "1")
    assert cudnn_deprioritized() is True
    monkeypatch.delenv(DEPRIORITIZED_ENV)
    assert cudnn_deprioritized() is False


def test_a_capability_passed_alone_means_a_cuda_device() -> None:
    facts = device_facts(capability=(9, 0), cudnn_version=91600)
    assert (facts.platform, facts.capability, facts.cudnn_version) == ("cuda", (9, 0), 91600)
    assert facts.describe() == "sm90, cuDNN 9.16.0"


def test_without_cuda_the_facts_are_the_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    # Also on a GPU machine (scripts/gpu_check.sh runs this folder there): no CUDA device is what is tested.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_facts() == DeviceFacts(platform="host", device_type="cpu")
    assert device_facts("mps").describe() == "mps"


def test_the_stand_in_cuda_of_the_acceptance_script_is_read_without_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (10, 0))
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91600)
    assert device_facts().describe() == "sm100, cuDNN 9.16.0"


def test_rocm_is_rocm_whatever_capability_it_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    # MI300 reports 9.4 through torch.cuda: no NVIDIA architecture, and no cuDNN.
    monkeypatch.setattr(devices, "is_rocm", lambda: True)
    assert device_facts("cuda", capability=(9, 4)) == DeviceFacts(platform="rocm", device_type="cuda")
    assert device_facts("cuda").describe() == "ROCm"


def test_xpu_is_xpu() -> None:
    assert device_facts("xpu") == DeviceFacts(platform="xpu", device_type="xpu")


def test_a_cuda_device_whose_capability_cannot_be_read_still_has_facts() -> None:
    # A CPU build asked about cuda:1: the ranking must come out rather than stop the server.
    facts = device_facts("cuda:1")
    assert (facts.platform, facts.capability) == ("cuda", None)
    assert facts.describe() == "cuda, capability unknown"
