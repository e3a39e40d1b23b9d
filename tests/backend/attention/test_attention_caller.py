"""Node attribution: the context variable, and per-(node type, serving kernel) call counts."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from invokeai.backend.attention import (
    NO_DEVICE,
    NO_NODE,
    attention_caller,
    attention_stats,
    current_device,
    current_node_type,
    install_attention,
)


def test_caller_sets_and_restores_the_node_type() -> None:
    assert current_node_type() == NO_NODE == "(no node)"
    with attention_caller("outer"):
        assert current_node_type() == "outer"
        with attention_caller("inner"):
            assert current_node_type() == "inner"
        assert current_node_type() == "outer"
    assert current_node_type() == NO_NODE


def test_caller_restores_when_the_body_raises() -> None:
    with pytest.raises(RuntimeError), attention_caller("failing_node"):
        raise RuntimeError("node failed")
    assert current_node_type() == NO_NODE


def test_each_thread_has_its_own_value() -> None:
    seen: dict[str, str] = {}
    entered, release = threading.Event(), threading.Event()

    def worker() -> None:
        with attention_caller("worker_node"):
            entered.set()
            release.wait(5)
            seen["worker"] = current_node_type()

    with attention_caller("main_node"):
        thread = threading.Thread(target=worker)
        thread.start()
        entered.wait(5)
        seen["main"] = current_node_type()
        release.set()
        thread.join()
        started_inside = threading.Thread(target=lambda: seen.__setitem__("fresh", current_node_type()))
        started_inside.start()
        started_inside.join()
    assert seen == {"worker": "worker_node", "main": "main_node", "fresh": NO_NODE}


def test_every_call_counts_once_under_node_type_and_serving_kernel() -> None:
    install_attention("auto")
    q = torch.randn(1, 2, 16, 8)
    with attention_caller("sd_text_encoder"):
        for _ in range(3):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
    with attention_caller("sd_denoise"):
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.2)  # CPU flash does not take dropout: math does
    F.scaled_dot_product_attention(q, q, q)
    assert attention_stats().counts == {
        "sd_text_encoder": {"FLASH_ATTENTION": 3},
        "sd_denoise": {"FLASH_ATTENTION": 1, "MATH": 1},
        NO_NODE: {"FLASH_ATTENTION": 1},
    }


def test_a_failing_call_is_not_counted() -> None:
    install_attention("auto")
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(RuntimeError), attention_caller("broken"):
        F.scaled_dot_product_attention(q, q[..., :4], q)
    assert "broken" not in attention_stats().counts


def test_counts_from_concurrent_threads_add_up() -> None:
    install_attention("auto")
    q = torch.randn(1, 1, 4, 4)

    def worker(name: str) -> None:
        with attention_caller(name):
            for _ in range(200):
                F.scaled_dot_product_attention(q, q, q)

    threads = [threading.Thread(target=worker, args=(f"node_{i % 2}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = attention_stats().counts
    assert counts["node_0"] == {"FLASH_ATTENTION": 400}
    assert counts["node_1"] == {"FLASH_ATTENTION": 400}


def test_install_starts_counting_afresh() -> None:
    install_attention("auto")
    q = torch.randn(1, 1, 4, 4)
    F.scaled_dot_product_attention(q, q, q)
    install_attention("efficient")
    assert attention_stats().counts == {}


def test_counts_are_kept_per_device_and_add_up_to_the_totals() -> None:
    install_attention("auto")
    q = torch.randn(1, 1, 4, 4)

    def worker(device: str, calls: int) -> None:
        with attention_caller("sd_denoise", device):
            for _ in range(calls):
                F.scaled_dot_product_attention(q, q, q)

    threads = [threading.Thread(target=worker, args=args) for args in (("cpu#0", 30), ("cpu#1", 50))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    F.scaled_dot_product_attention(q, q, q)
    stats = attention_stats()
    assert stats.counts_by_device == {
        "cpu#0": {"sd_denoise": {"FLASH_ATTENTION": 30}},
        "cpu#1": {"sd_denoise": {"FLASH_ATTENTION": 50}},
        NO_DEVICE: {NO_NODE: {"FLASH_ATTENTION": 1}},
    }
    assert stats.counts == {"sd_denoise": {"FLASH_ATTENTION": 80}, NO_NODE: {"FLASH_ATTENTION": 1}}


def test_a_nested_caller_keeps_the_enclosing_device() -> None:
    with attention_caller("outer", "cuda:1"):
        with attention_caller("inner"):
            assert (current_device(), current_node_type()) == ("cuda:1", "inner")
    assert current_device() == NO_DEVICE
