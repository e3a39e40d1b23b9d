"""demo-qwen-image, built once per session into a temporary folder, and the stock QwenImagePipeline on it (every
test here reads them; none may change them)."""

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
def demo_qwen_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from invokeai.backend.families.qwen_image import demo

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    path = tmp_path_factory.mktemp("qwen-image-demo") / demo.NAME
    demo.build(path)
    return path


@pytest.fixture(scope="session")
def qwen_pipe(demo_qwen_image: Path) -> Any:
    """The stock QwenImagePipeline on demo-qwen-image, as a user would load it."""
    import torch
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(demo_qwen_image, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="session")
def demo_qwen_image_edit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from invokeai.backend.families.qwen_image import demo

    path = tmp_path_factory.mktemp("qwen-image-edit-demo") / demo.EDIT_NAME
    demo.build_edit(path)
    return path
