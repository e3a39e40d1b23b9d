"""demo-flux, built once per session, and FluxPipeline on it (every test here reads them; none may change them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (the fixture of tests/conftest.py, made automatic)."""


@pytest.fixture(scope="session")
def demo_flux(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from invokeai.backend.families.flux import demo

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    path = tmp_path_factory.mktemp("flux-demo") / demo.NAME
    demo.build(path)
    return path


@pytest.fixture(scope="session")
def flux_pipe(demo_flux: Path) -> Any:
    """The stock FluxPipeline on demo-flux, as a user would load it."""
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(demo_flux, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe
