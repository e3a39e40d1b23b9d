"""demo-sdxl, built once per test session and loaded from its folder (every test reads it; none may change it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# No test may reach the hub: a missing local file must fail, not download.
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (the fixture of tests/conftest.py, made automatic)."""


@pytest.fixture(scope="session")
def sdxl_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from invokeai.backend.families.sdxl import demo

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    path = tmp_path_factory.mktemp("sdxl") / demo.NAME
    demo.build(path)
    return path


@pytest.fixture(scope="session")
def sdxl_parts(sdxl_folder: Path) -> dict[str, Any]:
    """The demo's components, loaded as diffusers loads the folder (fp32)."""
    import torch
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_folder, torch_dtype=torch.float32, local_files_only=True)
    return dict(pipe.components)
