"""Fixtures for the model cache and working-memory tests: one torch thread, a clean attention state, the stand-in
dispatcher (the CPU answering like a GPU's dispatcher, as in tests/backend/attention), and the demo models."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from invokeai.backend.attention import devices, uninstall_attention
from invokeai.backend.attention.torch_flags import apply_flags, read_flags

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from threads, and the machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def clean_attention() -> Iterator[None]:
    original = F.scaled_dot_product_attention
    flags = read_flags()
    yield
    uninstall_attention()
    F.scaled_dot_product_attention = original
    apply_flags(flags)


class StandInDispatcher:
    """`torch._fused_sdp_choice` as CUDA would answer it: the first kernel of the installed order and flags that is
    in `can_serve`, whatever the call."""

    def __init__(self, can_serve: set[str]) -> None:
        self.can_serve = can_serve

    def __call__(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
    ) -> int:  # type: ignore[no-untyped-def]
        flags = read_flags()
        for value_ in flags.order:
            if SDPBackend(value_) in flags.enabled and SDPBackend(value_).name in self.can_serve:
                return value_
        raise RuntimeError("No available kernel. Aborting execution.")


@pytest.fixture
def dispatcher(monkeypatch: pytest.MonkeyPatch) -> Callable[..., StandInDispatcher]:
    def make(*can_serve: str) -> StandInDispatcher:
        stand_in = StandInDispatcher(set(can_serve))
        monkeypatch.setattr(devices, "fused_sdp_choice", stand_in)
        return stand_in

    return make


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-sd1 and demo-krea2, built once per session."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from invokeai.backend.models.demo import KREA2_NAME, SD1_NAME, build_demo_models

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    root = tmp_path_factory.mktemp("cache-demo-models")
    build_demo_models(root, (SD1_NAME, KREA2_NAME))
    return root
