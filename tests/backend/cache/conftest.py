"""Fixtures for the model cache and working-memory tests: one torch thread, a clean attention state, the stand-in
dispatcher (the CPU answering like a GPU's dispatcher, as in tests/backend/attention), and the demo models."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from invokeai.backend.attention.testing import pristine_attention
from invokeai.backend.families.registry import FAMILIES

# Each family's first whole-pipeline demo model, by family: what the estimators are checked and cached against.
PIPELINE_DEMOS = {family.name: next(demo for demo in family.demos if demo.type == "main") for family in FAMILIES}

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
    """Each family's first whole-pipeline demo model (PIPELINE_DEMOS), built once per session."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from invokeai.backend.models.demo import build_demo_models

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    root = tmp_path_factory.mktemp("cache-demo-models")
    build_demo_models(root, tuple(demo.name for demo in PIPELINE_DEMOS.values()))
    return root
