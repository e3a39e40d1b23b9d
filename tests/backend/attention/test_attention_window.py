"""INVOKE_KREA2_SDPA_BACKEND windows and the per-step benchmark gate."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend as B

from invokeai.backend.attention import (
    WINDOW_ENV,
    WINDOW_MODES,
    attention_caller,
    attention_stats,
    install_attention,
    kernel_order,
    sdpa_window,
    step_benchmark,
    window_mode_from_env,
)
from invokeai.backend.attention.policy import read_flags


def test_unset_or_empty_means_the_ranked_list(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(WINDOW_ENV, raising=False)
    assert window_mode_from_env() is None
    monkeypatch.setenv(WINDOW_ENV, " ")
    assert window_mode_from_env() is None


@pytest.mark.parametrize("mode", ["cudnn", "efficient", "flash", "math", "priority-cudnn"])
def test_valid_modes_are_read(mode: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(WINDOW_ENV, mode)
    assert window_mode_from_env() == mode


@pytest.mark.parametrize("bad", ["CUDNN", "mem_efficient", "priority-flash", "auto"])
def test_any_other_value_raises_naming_the_valid_ones(bad: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(WINDOW_ENV, bad)
    with pytest.raises(ValueError) as error:
        window_mode_from_env()
    assert WINDOW_ENV in str(error.value) and all(mode in str(error.value) for mode in WINDOW_MODES)


@pytest.mark.parametrize(
    ("mode", "kernel"),
    [
        ("cudnn", B.CUDNN_ATTENTION),
        ("efficient", B.EFFICIENT_ATTENTION),
        ("flash", B.FLASH_ATTENTION),
        ("math", B.MATH),
    ],
)
def test_an_exclusive_window_enables_only_its_kernel_and_restores_the_ranked_list(mode: str, kernel: B) -> None:
    install_attention("auto")
    before = read_flags()
    with sdpa_window(mode):
        assert read_flags().enabled == {kernel}
        assert attention_stats().window == mode
    assert read_flags() == before
    assert attention_stats().window is None


def test_a_call_the_exclusive_kernel_cannot_serve_raises_visibly() -> None:
    # The CPU has no memory-efficient kernel: the window must not degrade to another kernel unnoticed.
    install_attention("auto")
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(RuntimeError, match=r"No viable backend|No available kernel"), sdpa_window("efficient"):
        F.scaled_dot_product_attention(q, q, q)
    F.scaled_dot_product_attention(q, q, q)  # the ranked list is back


def test_a_completed_exclusive_run_proves_the_kernel_served_it() -> None:
    install_attention("auto")
    q = torch.randn(1, 2, 16, 8)
    with sdpa_window("math"), attention_caller("krea2_denoise"):
        F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().counts["krea2_denoise"] == {"MATH": 1}


def test_priority_cudnn_ranks_cudnn_first_then_the_installed_order() -> None:
    install_attention("efficient")
    with sdpa_window("priority-cudnn"):
        order = torch._C._get_sdp_priority_order()
        assert order[:4] == [
            int(B.CUDNN_ATTENTION),
            *(int(k) for k in kernel_order("efficient") if k is not B.CUDNN_ATTENTION),
        ]
        assert read_flags().enabled >= set(kernel_order("auto"))


def test_a_window_does_not_leak_into_another_threads_calls() -> None:
    install_attention("auto")
    q = torch.randn(1, 2, 16, 8)
    other_started = threading.Event()
    finished: list[float] = []

    def other_thread() -> None:
        with attention_caller("other_node"):
            other_started.set()
            F.scaled_dot_product_attention(q, q, q)
            finished.append(time.monotonic())

    with sdpa_window("math"):
        thread = threading.Thread(target=other_thread)
        thread.start()
        other_started.wait(5)
        time.sleep(0.2)
        assert finished == [], "another thread's call ran inside the window"
        closed = time.monotonic()
    thread.join(5)
    assert finished and finished[0] >= closed
    # It ran after the window, on the ranked list: flash, not the window's math.
    assert attention_stats().counts["other_node"] == {"FLASH_ATTENTION": 1}


def test_windows_do_not_nest_and_need_an_installed_policy() -> None:
    with pytest.raises(RuntimeError, match="install"), sdpa_window("math"):
        pass
    install_attention("auto")
    with pytest.raises(RuntimeError, match="already open"), sdpa_window("math"), sdpa_window("flash"):
        pass
    assert attention_stats().window is None


def test_no_window_mode_is_a_no_op() -> None:
    install_attention("auto")
    before = read_flags()
    with sdpa_window(None) as window:
        assert window is None and read_flags() == before


def test_the_step_benchmark_exists_only_when_asked_and_on_cuda(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(WINDOW_ENV, raising=False)
    assert step_benchmark("cuda") is None
    monkeypatch.setenv(WINDOW_ENV, "efficient")
    assert step_benchmark("cpu") is None
    assert step_benchmark("cuda") is not None
