"""demo-anima, built once per session into a temporary folder, and the stock AnimaModularPipeline on it (every test
here reads them; none may change them)."""

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
def demo_anima(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from invokeai.backend.families.anima import demo

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    path = tmp_path_factory.mktemp("anima-demo") / demo.NAME
    demo.build(path)
    return path


@pytest.fixture(scope="session")
def anima_pipe(demo_anima: Path) -> Any:
    """The stock AnimaModularPipeline on demo-anima, as a user loads a folder of its components (its auto blocks on
    the folder, every component from it)."""
    import torch
    from diffusers.modular_pipelines import AnimaAutoBlocks

    pipe = AnimaAutoBlocks().init_pipeline(str(demo_anima))
    pipe.load_components(dtype=torch.float32, pretrained_model_name_or_path=str(demo_anima))
    pipe.set_progress_bar_config(disable=True)
    return pipe
