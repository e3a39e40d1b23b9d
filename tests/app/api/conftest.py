"""Fixtures for the API tests: the real app (services, processor) on an in-memory database under tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from api_support import MakeClient
from fastapi.testclient import TestClient
from web_server import LOCAL_BASE_URL

from invokeai.app.api.app_factory import create_app
from invokeai.app.config import InvokeAIAppConfig


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[MakeClient]:
    """make_client(**settings): a client of a started app (lifespan run) with these settings over the defaults."""
    with ExitStack() as stack:

        def make(*, run_processor: bool = True, **settings: Any) -> TestClient:
            config = InvokeAIAppConfig.located({"use_memory_db": True, **settings}, tmp_path, None)
            return stack.enter_context(
                TestClient(create_app(config, run_processor=run_processor), base_url=LOCAL_BASE_URL)
            )

        yield make


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    return make_client()
