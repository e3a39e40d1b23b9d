"""The demo models, built once per test session (every test here reads them; none may change them)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from models_testlib import DemoBuild

# No test may reach the hub: a missing local file must fail, not download.
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (the fixture of tests/conftest.py, made automatic)."""


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory: pytest.TempPathFactory) -> DemoBuild:
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from invokeai.backend.models.demo import build_demo_models

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    root = tmp_path_factory.mktemp("demo-models")
    start = time.perf_counter()
    build_demo_models(root)
    return DemoBuild(root, time.perf_counter() - start)


@pytest.fixture(scope="session")
def demo_checkpoint(demo_build: DemoBuild, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-sd1 as one original-layout SD-1.5 safetensors file."""
    from invokeai.backend.families.sd1.convert import sd1_pipeline_to_checkpoint

    return sd1_pipeline_to_checkpoint(demo_build.sd1, tmp_path_factory.mktemp("checkpoint") / "demo-sd1.safetensors")
