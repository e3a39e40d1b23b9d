"""Fixtures for the model cache and working-memory tests: one torch thread, a clean attention state, the stand-in
dispatcher (the CPU answering like a GPU's dispatcher, as in tests/backend/attention), and the demo models."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from invokeai.backend.attention.testing import pristine_attention

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (the fixture of tests/conftest.py, made automatic)."""


@pytest.fixture(autouse=True)
def clean_attention() -> Iterator[None]:
    with pristine_attention():
        yield


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-sd1, demo-krea2, demo-flux and demo-sdxl, built once per session."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from invokeai.backend.models.demo import build_demo_models

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    root = tmp_path_factory.mktemp("cache-demo-models")
    build_demo_models(root, ("demo-sd1", "demo-krea2", "demo-flux", "demo-sdxl"))
    return root
