"""Fixtures for the model tests: the demo models and an SD-1 single file built once per session, and the real app
on an in-memory database with models_dir under tmp_path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from web_server import LOCAL_BASE_URL

from invokeai.app.api.app_factory import create_app
from invokeai.app.config import InvokeAIAppConfig


@pytest.fixture(scope="session")
def built_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Install sources: demo-sd1, demo-krea2 (folders), demo-krea2-gguf (.gguf) and sd1-single (.safetensors).
    Read-only for tests: an install copies them, an in-place install only records them."""
    from invokeai.backend.families.sd1.convert import sd1_pipeline_to_checkpoint
    from invokeai.backend.models.demo import build_demo_models

    torch.set_num_threads(1)
    dest = tmp_path_factory.mktemp("model-sources")
    paths = {model.name: model.path for model in build_demo_models(dest)}
    paths["sd1-single"] = sd1_pipeline_to_checkpoint(paths["demo-sd1"], dest / "sd1-single.safetensors")
    return paths


@pytest.fixture
def make_app_client(tmp_path: Path) -> Iterator[Callable[..., TestClient]]:
    """make_app_client(**settings): a client of the started app (its processor idle unless run_processor=True);
    demo_models=True passes create_app's flag."""
    with ExitStack() as stack:

        def make(*, demo_models: bool = False, run_processor: bool = False, **settings: Any) -> TestClient:
            config = InvokeAIAppConfig.located({"use_memory_db": True, **settings}, tmp_path / "root", None)
            app = create_app(config, run_processor=run_processor, demo_models=demo_models)
            return stack.enter_context(TestClient(app, base_url=LOCAL_BASE_URL))

        yield make


@pytest.fixture
def client(make_app_client: Callable[..., TestClient]) -> TestClient:
    return make_app_client()
