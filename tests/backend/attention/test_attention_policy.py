"""auto ranked by architecture, with device stand-ins: sm80-sm89 keep flash first, sm90 and sm10x with cuDNN newer
than 9.15.0 put cuDNN first as PyTorch does (unless TORCH_CUDNN_SDPA_DEPRIORITIZED=1), ROCm, XPU and host devices
keep their order; a pin goes first; the reason names the facts."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend as B

from invokeai.backend.attention import attention_stats, install_attention, kernel_order, policy
from invokeai.backend.attention.architecture import DEPRIORITIZED_ENV, DeviceFacts
from invokeai.backend.attention.policy import (
    AUTO_ORDER,
    CUDNN_FIRST_ORDER,
    pytorch_prefers_cudnn,
    ranking,
    settle_pytorch_order,
)

FLASH_FIRST = list(AUTO_ORDER)
CUDNN_FIRST = list(CUDNN_FIRST_ORDER)
CUDNN_VERSIONS = {"9.10": 91000, "9.15.0": 91500, "9.15.1": 91501, "9.16": 91600}
NO_ENV: dict[str, str] = {}


@pytest.mark.parametrize("cudnn", CUDNN_VERSIONS)
@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (8, 9)])
def test_ampere_and_ada_keep_flash_cudnn_efficient_math(capability: tuple[int, int], cudnn: str) -> None:
    order = kernel_order("auto", capability=capability, cudnn_version=CUDNN_VERSIONS[cudnn], env=NO_ENV)
    assert order == [B.FLASH_ATTENTION, B.CUDNN_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH]


@pytest.mark.parametrize(
    ("cudnn", "cudnn_first"), [("9.10", False), ("9.15.0", False), ("9.15.1", True), ("9.16", True)]
)
@pytest.mark.parametrize("capability", [(9, 0), (10, 0), (10, 3)])
def test_hopper_and_blackwell_put_cudnn_first_only_with_cudnn_newer_than_9_15_0(
    capability: tuple[int, int], cudnn: str, cudnn_first: bool
) -> None:
    order = kernel_order("auto", capability=capability, cudnn_version=CUDNN_VERSIONS[cudnn], env=NO_ENV)
    assert order == (CUDNN_FIRST if cudnn_first else FLASH_FIRST)


@pytest.mark.parametrize("capability", [(12, 0), (12, 1), (11, 0), (7, 5)])
def test_other_nvidia_architectures_keep_flash_first_as_pytorch_does(capability: tuple[int, int]) -> None:
    # PyTorch's check_prefer_cudnn_attention names majors 9 and 10 only: consumer Blackwell (sm120) keeps flash.
    assert kernel_order("auto", capability=capability, cudnn_version=91600, env=NO_ENV) == FLASH_FIRST


@pytest.mark.parametrize(("value", "cudnn_first"), [("1", False), ("0", True), ("true", True), (None, True)])
def test_the_deprioritized_variable_is_honoured_as_pytorch_honours_it(value: str | None, cudnn_first: bool) -> None:
    env = {} if value is None else {DEPRIORITIZED_ENV: value}
    order = kernel_order("auto", capability=(9, 0), cudnn_version=91600, env=env)
    assert order == (CUDNN_FIRST if cudnn_first else FLASH_FIRST)


def test_the_environment_defaults_to_the_process_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEPRIORITIZED_ENV, "1")
    assert kernel_order("auto", capability=(9, 0), cudnn_version=91600)[0] is B.FLASH_ATTENTION
    monkeypatch.delenv(DEPRIORITIZED_ENV)
    assert kernel_order("auto", capability=(9, 0), cudnn_version=91600)[0] is B.CUDNN_ATTENTION


@pytest.mark.parametrize(("capability", "cudnn"), [(90, 91600), ((9, 0), (9, 16, 0)), (100, (9, 15, 1))])
def test_the_facts_may_be_written_as_pytorch_or_as_tuples(capability: object, cudnn: object) -> None:
    assert kernel_order("auto", capability=capability, cudnn_version=cudnn, env=NO_ENV) == CUDNN_FIRST  # type: ignore[arg-type]


@pytest.mark.parametrize(("minor", "cudnn_first"), [(0, True), (3, True), (1, False)])
def test_builds_against_cuda_12_prefer_cudnn_only_on_minor_0_and_3(minor: int, cudnn_first: bool) -> None:
    facts = DeviceFacts(platform="cuda", device_type="cuda", capability=(10, minor), cudnn_version=91600, cuda_build=12)
    assert pytorch_prefers_cudnn(facts, NO_ENV) is cudnn_first
    assert pytorch_prefers_cudnn(DeviceFacts(**{**facts.__dict__, "cuda_build": 13}), NO_ENV) is True


def test_a_build_without_cudnn_keeps_flash_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)
    found = ranking("auto", capability=(9, 0), env=NO_ENV)
    assert list(found.order) == FLASH_FIRST
    assert "no cuDNN" in found.reason


def test_the_acceptance_scripts_stand_in_is_read_when_nothing_is_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91600)
    monkeypatch.delenv(DEPRIORITIZED_ENV, raising=False)
    assert kernel_order("auto") == CUDNN_FIRST
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    assert kernel_order("auto") == FLASH_FIRST


@pytest.mark.parametrize("capability", [(9, 4), (9, 0), None])
def test_rocm_keeps_its_order(capability: tuple[int, int] | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from invokeai.backend import devices

    monkeypatch.setattr(devices, "is_rocm", lambda: True)
    found = ranking("auto", capability=capability, cudnn_version=91600, env=NO_ENV, device="cuda")
    assert list(found.order) == FLASH_FIRST
    assert found.reason.startswith("ROCm")


def test_xpu_keeps_its_order() -> None:
    found = ranking("auto", device="xpu", env=NO_ENV)
    assert list(found.order) == FLASH_FIRST
    assert "XPU" in found.reason and "oneDNN" in found.reason


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_host_devices_keep_the_order_they_ignore(device: str) -> None:
    found = ranking("auto", device=device)
    assert list(found.order) == FLASH_FIRST
    assert f"{device}: PyTorch picks the kernel itself" in found.reason


def test_without_cuda_nothing_changes() -> None:
    assert kernel_order("auto") == FLASH_FIRST


@pytest.mark.parametrize(
    ("setting", "pinned"),
    [
        ("flash", B.FLASH_ATTENTION),
        ("efficient", B.EFFICIENT_ATTENTION),
        ("math", B.MATH),
        ("cudnn", B.CUDNN_ATTENTION),
    ],
)
@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_a_pin_still_goes_first_then_the_devices_auto_order(
    setting: str, pinned: B, capability: tuple[int, int]
) -> None:
    auto = kernel_order("auto", capability=capability, cudnn_version=91600, env=NO_ENV)
    found = ranking(setting, capability=capability, cudnn_version=91600, env=NO_ENV)
    assert found.order[0] is pinned
    assert list(found.order[1:]) == [kernel for kernel in auto if kernel is not pinned]
    assert found.reason.startswith(f"attention_backend {setting!r} pins")


def test_sage_ranks_pytorchs_kernels_as_auto_does_on_each_device() -> None:
    for capability in ((8, 9), (9, 0)):
        assert kernel_order("sage", capability=capability, cudnn_version=91600, env=NO_ENV) == kernel_order(
            "auto", capability=capability, cudnn_version=91600, env=NO_ENV
        )


def test_the_reasons_cite_the_facts() -> None:
    hopper = ranking("auto", capability=(9, 0), cudnn_version=91600, env=NO_ENV).reason
    assert hopper.startswith("sm90, cuDNN 9.16.0: cuDNN first")
    assert "pytorch#142132" in hopper and "631" in hopper and "329" in hopper and "[1, 24, 4608, 128]" in hopper
    assert "193893" not in hopper
    blackwell = ranking("auto", capability=(10, 0), cudnn_version=91600, env=NO_ENV).reason
    assert (
        "pytorch#142132" in blackwell and "pytorch#193893" in blackwell and "fewer than 8 key-value heads" in blackwell
    )
    old = ranking("auto", capability=(9, 0), cudnn_version=91500, env=NO_ENV).reason
    assert "flash first" in old and "newer than 9.15.0" in old
    off = ranking("auto", capability=(9, 0), cudnn_version=91600, env={DEPRIORITIZED_ENV: "1"}).reason
    assert f"{DEPRIORITIZED_ENV}=1" in off
    ada = ranking("auto", capability=(8, 9), cudnn_version=91600, env=NO_ENV).reason
    assert ada.startswith("sm89, cuDNN 9.16.0: flash first") and "19.74 ms" in ada


def test_an_unknown_setting_is_still_a_value_error() -> None:
    with pytest.raises(ValueError, match="'fast'"):
        kernel_order("fast", capability=(9, 0), cudnn_version=91600)


def _stand_in_device(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], cudnn: int) -> None:
    """The install ranks for a stand-in CUDA device (the CPU still runs the calls)."""
    real = policy.device_facts
    monkeypatch.setattr(policy, "device_facts", lambda device, c, v: real(None, c or capability, v or cudnn))


def test_the_install_ranks_for_the_device_logs_why_and_tells_the_stats(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    _stand_in_device(monkeypatch, (9, 0), 91600)
    monkeypatch.delenv(DEPRIORITIZED_ENV, raising=False)
    with caplog.at_level("INFO", logger="invokeai.backend.attention.install"):
        install_attention("auto", device="cpu")
    order = torch._C._get_sdp_priority_order()
    assert order[:4] == [int(kernel) for kernel in CUDNN_FIRST]
    stats = attention_stats()
    assert stats.order == [kernel.name for kernel in CUDNN_FIRST]
    assert stats.ranked_for == "sm90, cuDNN 9.16.0"
    assert stats.order_reason is not None and "pytorch#142132" in stats.order_reason
    (line,) = [r.getMessage() for r in caplog.records if "kernels ranked" in r.getMessage()]
    assert line.startswith("attention_backend 'auto' on cpu: kernels ranked CUDNN_ATTENTION, FLASH_ATTENTION")
    assert stats.order_reason in line
    assert "cudnn_guard" not in stats.layers  # sm90 needs no guard


def test_before_the_install_the_stats_have_no_ranking() -> None:
    stats = attention_stats()
    assert (stats.order, stats.order_reason, stats.ranked_for) == ([], None, None)


def test_a_demotion_changes_the_order_but_not_the_reason_it_was_ranked_for(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from invokeai.backend.attention.install import rebind
    from invokeai.backend.attention.state import STATE

    _stand_in_device(monkeypatch, (8, 9), 91600)
    install_attention("auto", device="cpu")
    reason = attention_stats().order_reason
    STATE.cudnn_demoted = True
    STATE.order = policy.demoted_order(STATE.order)
    STATE.apply()
    rebind()
    stats = attention_stats()
    assert stats.order[-1] == "CUDNN_ATTENTION" and stats.order_reason == reason


def test_settling_pytorchs_order_is_a_no_op_off_cuda() -> None:
    before = torch._C._get_sdp_priority_order()
    settle_pytorch_order(torch.device("cpu"))
    settle_pytorch_order(torch.device("cuda", 3))  # a CPU build: swallowed
    assert torch._C._get_sdp_priority_order() == before
