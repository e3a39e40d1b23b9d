"""GET /api/v1/app/version and /api/v1/app/config, in process."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
from fastapi.encoders import jsonable_encoder
from fastapi.testclient import TestClient

import invokeai
from invokeai.app import version as version_module
from invokeai.app.api.app_factory import create_app
from invokeai.app.api.routers import app as app_router
from invokeai.app.config import CliArgs, load_config
from invokeai.app.config.describe import SETTINGS
from invokeai.backend.attention import attention_stats


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setenv("INVOKEAI_ATTENTION_BACKEND", "efficient")
    (tmp_path / "invokeai.yaml").write_text("port: 9100\nmodels_dir: /data/models\n")
    return TestClient(create_app(load_config(CliArgs(root=tmp_path)).config))


def test_version_is_the_installed_one(client: TestClient) -> None:
    response = client.get("/api/v1/app/version")
    assert response.status_code == 200
    assert response.json() == {"version": installed_version("invokeai")}


def test_version_falls_back_to_the_package(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(version_module, "version", not_installed)
    monkeypatch.setattr(invokeai, "__version__", "9.9.9-source")
    assert client.get("/api/v1/app/version").json() == {"version": "9.9.9-source"}


def test_config_answers_effective_settings(client: TestClient, tmp_path: Path) -> None:
    response = client.get("/api/v1/app/config")
    assert response.status_code == 200
    body = response.json()
    assert body["root"] == str(tmp_path)
    assert body["config_file"] == str(tmp_path / "invokeai.yaml")
    assert set(body["config"]) == set(SETTINGS) - {"api_token"}  # secret
    assert body["config"]["port"] == 9100  # from the file
    assert body["config"]["attention_backend"] == "efficient"  # from the environment
    assert body["config"]["models_dir"] == "/data/models"
    assert body["config"]["host"] == "127.0.0.1"  # the default


def test_config_names_the_startup_only_settings(client: TestClient) -> None:
    startup_only = client.get("/api/v1/app/config").json()["startup_only"]
    assert "attention_backend" in startup_only
    expected = [name for name, field in SETTINGS.items() if field.json_schema_extra["startup_only"]]  # type: ignore[index]
    assert startup_only == expected


def test_openapi_lists_the_app_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/api/v1/app/version", "/api/v1/app/config"} <= set(paths)


def test_attention_answers_the_attention_packages_stats(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    stats = {
        "setting": "flash",
        "installed": True,
        "order": ["FLASH_ATTENTION", "MATH"],
        "probe": {"device": "cpu"},
        "reports": [{"node": "sd1_denoise", "kernel": "MATH", "reason": "mask"}],
        "counts": {"sd1_denoise": {"MATH": 3}},
        "window": None,  # keys the model does not name pass through as they are
    }
    monkeypatch.setattr(app_router, "attention_stats", lambda: stats)
    response = client.get("/api/v1/app/attention")
    assert response.status_code == 200
    assert response.json() == stats


def test_attention_answers_the_real_stats(client: TestClient) -> None:
    assert client.get("/api/v1/app/attention").json() == jsonable_encoder(attention_stats())
