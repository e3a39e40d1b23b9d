"""A real `invokeai-web` on a fresh root (which installs every family's demo models at its first start), one for
the whole run (its start and demo installs are the slow part; each test makes its own items, images and models and
reads only those), and a client of it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from web_server import WebServer


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """invokeai-web on a fresh root, on the CPU in float32 (what the stock pipelines are compared in); its base URL
    once it answers (the demo models are installed by then)."""
    with WebServer.running(tmp_path_factory.mktemp("generation-server")) as server:
        yield server.base


@pytest.fixture(scope="session")
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as client:
        yield client
