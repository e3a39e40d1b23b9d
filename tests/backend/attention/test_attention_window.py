"""The benchmarking window over PyTorch's kernel flags, and the per-step benchmark gate. (Which environment variable
opens a window is the model family's business: the Krea-2 tests cover INVOKE_KREA2_SDPA_BACKEND.)"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import CodeType

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend as B

import invokeai.backend.attention.benchmarking as benchmarking
from invokeai.backend.attention import (
    attention_caller,
    attention_stats,
    install_attention,
    kernel_order,
    uninstall_attention,
)
from invokeai.backend.attention.benchmarking import WINDOW_MODES, sdpa_window, step_benchmark
from invokeai.backend.attention.policy import KernelFlags, apply_flags, read_flags
from invokeai.backend.attention.state import STATE
from invokeai.backend.attention.testing import DispatchedCall

# Every wait in these tests is bounded: a regression fails them, it does not hang the suite.
WAIT_S = 5.0


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


@pytest.mark.parametrize("earlier_windows", [0, 1], ids=["first window", "a later window"])
def test_a_window_makes_another_threads_call_wait(earlier_windows: int) -> None:
    # From the first window on, every call takes the lock the window holds: PyTorch's flags are process-global.
    install_attention("auto")
    for _ in range(earlier_windows):
        with sdpa_window("flash"):
            pass
    q = torch.randn(1, 2, 16, 8)
    other_started = threading.Event()
    finished: list[float] = []

    def other_thread() -> None:
        with attention_caller("other_node"):
            other_started.set()
            F.scaled_dot_product_attention(q, q, q)
            finished.append(time.monotonic())

    thread = threading.Thread(target=other_thread)
    with sdpa_window("math"):
        thread.start()
        assert other_started.wait(WAIT_S)
        time.sleep(0.2)
        assert finished == [], "another thread's call ran inside the window"
        closed = time.monotonic()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert finished and finished[0] >= closed
    # It ran after the window, on the ranked list: flash, not the window's math.
    assert attention_stats().counts["other_node"] == {"FLASH_ATTENTION": 1}


def test_opening_the_first_window_waits_for_a_call_already_in_flight(dispatcher) -> None:  # type: ignore[no-untyped-def]
    # Thread B is inside SDPA, held in the dispatcher query after PyTorch's flags were read, when thread A opens an
    # exclusive window whose kernel the CPU lacks. Had the window opened, B's call would run under it and raise
    # "No viable backend"; instead A waits until B's call is done.
    in_query, release, b_done, window_open = (threading.Event() for _ in range(4))
    holder: dict[str, threading.Thread] = {}

    def flash_holding_b(call: DispatchedCall) -> bool:
        if threading.current_thread() is holder.get("b") and not release.is_set():
            in_query.set()
            release.wait(WAIT_S)
        return True

    dispatcher({"FLASH_ATTENTION": flash_holding_b, "MATH": lambda call: True})
    install_attention("auto", device="cpu")
    q = torch.randn(1, 2, 16, 8)
    outcome: dict[str, object] = {}

    def call_in_b() -> None:
        try:
            outcome["b"] = F.scaled_dot_product_attention(q, q, q)
        except Exception as error:
            outcome["b"] = error
        b_done.set()

    def open_window_in_a() -> None:
        with sdpa_window("efficient"):
            window_open.set()
            outcome["b done when the window opened"] = b_done.is_set()
            b_done.wait(WAIT_S)  # keep the window open while B would still run

    holder["b"] = b = threading.Thread(target=call_in_b)
    a = threading.Thread(target=open_window_in_a)
    b.start()
    try:
        assert in_query.wait(WAIT_S)
        a.start()
        opened_while_b_ran = window_open.wait(0.3)
    finally:
        release.set()
        b.join(WAIT_S)
        if a.ident is not None:
            a.join(WAIT_S)
    assert not a.is_alive() and not b.is_alive()
    assert isinstance(outcome["b"], torch.Tensor), f"B's call ran under the window: {outcome['b']}"
    assert not opened_while_b_ran and outcome["b done when the window opened"] is True


def test_a_second_window_waits_for_the_first_windows_wait(dispatcher) -> None:  # type: ignore[no-untyped-def]
    # B is inside SDPA (held in the dispatcher query) when A starts opening the first window, so A waits for B's
    # call. Meanwhile D opens a window from another thread: had it gone straight in, B's call would run under D's
    # exclusive flags (a kernel the CPU lacks) and raise. D must wait until A's wait is over.
    in_query, release, d_open = threading.Event(), threading.Event(), threading.Event()
    holder: dict[str, threading.Thread] = {}

    def flash_holding_b(call: DispatchedCall) -> bool:
        if threading.current_thread() is holder.get("b") and not release.is_set():
            in_query.set()
            release.wait(WAIT_S)
        return True

    dispatcher({"FLASH_ATTENTION": flash_holding_b, "MATH": lambda call: True})
    install_attention("auto", device="cpu")
    q = torch.randn(1, 2, 16, 8)
    outcome: dict[str, object] = {}

    def call_in_b() -> None:
        try:
            outcome["b"] = F.scaled_dot_product_attention(q, q, q)
        except Exception as error:
            outcome["b"] = error

    def open_window(name: str, mode: str) -> None:
        try:
            with sdpa_window(mode, source=name):
                if name == "d":
                    d_open.set()
        except Exception as error:
            outcome[name] = error

    holder["b"] = b = threading.Thread(target=call_in_b)
    a = threading.Thread(target=open_window, args=("a", "math"))
    d = threading.Thread(target=open_window, args=("d", "efficient"))
    draining = benchmarking._wait_for_unlocked_calls.__code__
    try:
        b.start()
        assert in_query.wait(WAIT_S)
        a.start()
        assert _until(lambda: _running(a, draining))
        d.start()
        opened_while_b_ran = d_open.wait(0.3)
    finally:
        release.set()
        for thread in (b, a, d):
            if thread.ident is not None:
                thread.join(WAIT_S)
    assert not any(thread.is_alive() for thread in (a, b, d))
    assert isinstance(outcome["b"], torch.Tensor), f"B's call ran under the second window: {outcome['b']}"
    assert not opened_while_b_ran
    assert "a" not in outcome and "d" not in outcome  # both windows opened in turn, neither failed


def _running(thread: threading.Thread, code: CodeType) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None


def _until(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_the_first_window_waits_only_for_the_calls_in_flight_when_it_starts_opening(dispatcher) -> None:  # type: ignore[no-untyped-def]
    # Calls that start while the window is opening take the lock, so they need no waiting for: with calls that keep
    # coming, waiting for a moment when no thread is inside SDPA could wait for ever. B is in flight when A starts
    # opening; C starts after, and is held (holding the lock) after B is done: A must stop draining then and wait
    # for the lock, which C's call gives back when done.
    held = {name: (threading.Event(), threading.Event()) for name in ("b", "c")}  # (inside, release)
    threads: dict[str, threading.Thread] = {}

    def flash_holding(call: DispatchedCall) -> bool:
        for name, (inside, release) in held.items():
            if threading.current_thread() is threads.get(name) and not release.is_set():
                inside.set()
                release.wait(WAIT_S)
        return True

    dispatcher({"FLASH_ATTENTION": flash_holding, "MATH": lambda call: True})
    install_attention("auto", device="cpu")
    q = torch.randn(1, 2, 16, 8)
    outcome: dict[str, object] = {}
    window_open = threading.Event()

    def call(name: str) -> None:
        try:
            with attention_caller(name):
                outcome[name] = F.scaled_dot_product_attention(q, q, q)
        except Exception as error:
            outcome[name] = error

    def open_window() -> None:
        with sdpa_window("efficient"):
            window_open.set()
            outcome["c done when the window opened"] = "c" in outcome

    threads.update(b=threading.Thread(target=call, args=("b",)), c=threading.Thread(target=call, args=("c",)))
    a = threading.Thread(target=open_window)
    draining = benchmarking._wait_for_unlocked_calls.__code__
    try:
        threads["b"].start()
        assert held["b"][0].wait(WAIT_S)
        a.start()
        assert _until(lambda: STATE.serialize)
        threads["c"].start()
        assert held["c"][0].wait(WAIT_S)
        held["b"][1].set()
        threads["b"].join(WAIT_S)
        stopped_draining = _until(lambda: not _running(a, draining))
        opened_while_c_ran = window_open.is_set()
    finally:
        for _, release in held.values():
            release.set()
        for thread in (*threads.values(), a):
            if thread.ident is not None:
                thread.join(WAIT_S)
    assert stopped_draining, "the window kept waiting for a call that started after it"
    assert not opened_while_c_ran
    assert all(isinstance(outcome[name], torch.Tensor) for name in ("b", "c")), outcome
    assert window_open.is_set() and outcome["c done when the window opened"] is True
    assert attention_stats().counts == {"b": {"FLASH_ATTENTION": 1}, "c": {"FLASH_ATTENTION": 1}}


def test_uninstall_inside_a_window_restores_exactly_and_the_window_leaves_it_alone() -> None:
    custom = read_flags()
    custom = KernelFlags(custom.enabled - {B.FLASH_ATTENTION}, (0, 3, 2, 1, 4))
    apply_flags(custom)
    original = F.scaled_dot_product_attention
    install_attention("auto")
    with sdpa_window("math"):
        uninstall_attention()
        assert F.scaled_dot_product_attention is original
        assert read_flags() == custom
    assert F.scaled_dot_product_attention is original
    assert read_flags() == custom
    assert attention_stats().window is None


def test_a_reinstall_inside_a_window_keeps_its_own_flags_when_the_window_closes() -> None:
    install_attention("auto")
    with sdpa_window("math"):
        install_attention("efficient")
        installed = read_flags()
        assert installed.order[0] == int(B.EFFICIENT_ATTENTION)
    assert read_flags() == installed
    assert attention_stats().window is None


def test_windows_do_not_nest_and_need_an_installed_policy() -> None:
    with pytest.raises(RuntimeError, match="INVOKE_KREA2_SDPA_BACKEND=math window needs the attention policy"):
        with sdpa_window("math", source="INVOKE_KREA2_SDPA_BACKEND=math"):
            pass
    install_attention("auto")
    with pytest.raises(RuntimeError, match="already open"), sdpa_window("math"), sdpa_window("flash"):
        pass
    assert attention_stats().window is None


@pytest.mark.parametrize("bad", ["CUDNN", "mem_efficient", "priority-flash", "auto"])
def test_an_unknown_mode_raises_naming_the_valid_ones(bad: str) -> None:
    install_attention("auto")
    with pytest.raises(ValueError) as error, sdpa_window(bad):
        pass
    assert repr(bad) in str(error.value) and all(mode in str(error.value) for mode in WINDOW_MODES)


def test_no_window_mode_is_a_no_op() -> None:
    install_attention("auto")
    before = read_flags()
    with sdpa_window(None) as window:
        assert window is None and read_flags() == before


def test_the_step_benchmark_exists_only_when_asked_and_on_cuda() -> None:
    assert step_benchmark("cuda", None, "krea2") is None
    assert step_benchmark("cpu", "efficient", "krea2") is None
    benchmark = step_benchmark("cuda", "efficient", "krea2")
    assert benchmark is not None
    assert (benchmark.device, benchmark.mode, benchmark.label) == (torch.device("cuda"), "efficient", "krea2")
