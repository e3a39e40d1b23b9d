"""invokeai-py-client 1.1.1 (PyPI), InvokeAI's Python client, against a real `invokeai-web`: it installs models
(its install_model and job handle), lists them (dnn_model_repo.list_models) and gets one by key
(get_model_by_key), parsing this server's records with its own models."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from invokeai_py_client import InvokeAIClient
from invokeai_py_client.dnn_model import BaseDnnModelType, DnnModelFormat, DnnModelType
from pydantic import ValidationError
from web_server import WebServer

from invokeai.backend.families.registry import FAMILIES

# The demo models whose base, type and format the client's enums know (its enums predate some of InvokeAI 6.14.2's
# bases): those it can list. The others are below.
KNOWN_BASES = {base.value for base in BaseDnnModelType}
CLIENT_DEMOS = [demo for family in FAMILIES if family.invokeai.base in KNOWN_BASES for demo in family.demos]
OTHER_DEMOS = [demo for family in FAMILIES if family.invokeai.base not in KNOWN_BASES for demo in family.demos]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """invokeai-web on a fresh root without demo models; its base URL once it answers."""
    with WebServer.running(tmp_path, install_demo_models="false") as server:
        yield server.base


def test_the_client_installs_lists_and_gets_models(server: str, built_models: dict[str, Path]) -> None:
    assert CLIENT_DEMOS, "no family has a base the client knows"
    client = InvokeAIClient.from_url(server, timeout=30.0, max_retries=0)
    keys = {}
    for demo in CLIENT_DEMOS:
        handle = client.dnn_model_repo.install_model(
            str(built_models[demo.name]), config={"description": f"{demo.name} (client)"}, inplace=True
        )
        info = handle.wait_until(timeout=60, poll_interval=0.1)
        assert info.status.value == "completed" and info.model_key, info
        keys[demo.name] = info.model_key
    listed = client.dnn_model_repo.list_models()
    assert sorted(model.name for model in listed) == sorted(keys)
    for model in listed:
        family = next(f for f in FAMILIES if any(d.name == model.name for d in f.demos))
        assert model.base.value == family.invokeai.base
        assert isinstance(model.file_size, int) and model.file_size > 0
        assert model.type in set(DnnModelType) and model.format in set(DnnModelFormat)
        assert model.hash.startswith("sha256:") and model.description == f"{model.name} (client)"
        got = client.dnn_model_repo.get_model_by_key(keys[model.name])
        assert got == model
    assert client.dnn_model_repo.get_model_by_key("no-such-key") is None
    # A second install of a name taken: the client reads InvokeAI's 409 as "already installed".
    again = client.dnn_model_repo.install_model(str(built_models[CLIENT_DEMOS[0].name]), inplace=True)
    assert (again.info.extra or {}).get("reason") == "already_installed"  # type: ignore[union-attr]


@pytest.mark.skipif(not OTHER_DEMOS, reason="every family's base is one the client knows")
def test_the_client_cannot_parse_a_base_newer_than_its_enum(server: str, built_models: dict[str, Path]) -> None:
    """Client 1.1.1's BaseDnnModelType stops before InvokeAI 6.14.2's newer bases (z-image, krea-2): InvokeAI 6.14.2
    lists such a model with that base too, and the client fails on it there as here (docs/api.md)."""
    demo = OTHER_DEMOS[0]
    response = httpx.post(
        f"{server}/api/v2/models/install",
        params={"source": str(built_models[demo.name]), "inplace": "true"},
        json={"description": "newer base"},
    )
    assert response.status_code == 201, response.text
    client = InvokeAIClient.from_url(server, timeout=30.0, max_retries=0)
    deadline = time.monotonic() + 60
    while httpx.get(f"{server}/api/v2/models/install/{response.json()['id']}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(ValidationError, match="base"):
        client.dnn_model_repo.list_models()
