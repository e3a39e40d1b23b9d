"""GET /api/v1/app/version, /api/v1/app/config and /api/v1/app/attention, in process."""

from __future__ import annotations

import dataclasses
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
from invokeai.app.config.describe import SETTINGS, secret_settings
from invokeai.backend.attention import AttentionStats, attention_stats
from invokeai.backend.attention.probe import KernelProbe
from invokeai.backend.attention.stats import AttentionEvent, AttentionReport


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
    assert set(body["config"]) == set(SETTINGS) - {"api_token", "database_url"}  # secret
    assert secret_settings() == {"api_token", "database_url"}  # a URL may hold a password
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


def test_attention_answers_the_attention_packages_record(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    record = AttentionStats(
        setting="flash",
        installed=True,
        device="cuda:0",
        order=["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"],
        torch_priority_order=["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "OVERRIDEABLE"],
        layers=["cudnn_fallback", "report"],
        cudnn_demoted=False,
        window=None,
        probe=KernelProbe(
            device="cuda:0 (GPU)",
            torch="2.13.0",
            shape=[1, 24, 1024, 128],
            dtype="bfloat16",
            mask="no mask",
            flash=False,
            cudnn=True,
            efficient=True,
            sage=False,
        ),
        unavailable=["FLASH_ATTENTION"],
        sage=None,
        reports=[
            AttentionReport(
                node_type="sd1_denoise",
                pinned="FLASH_ATTENTION",
                serving="CUDNN_ATTENTION",
                reason="unavailable",
                message="attention_backend 'flash' is not possible ...",
            )
        ],
        events=[AttentionEvent(event="cudnn_demoted", node_type="sd1_denoise", error="CUDNN_STATUS_BAD_PARAM")],
        counts={"sd1_denoise": {"CUDNN_ATTENTION": 3}},
        counts_by_device={"cuda:0": {"sd1_denoise": {"CUDNN_ATTENTION": 3}}},
    )
    monkeypatch.setattr(app_router, "attention_stats", lambda: record)
    response = client.get("/api/v1/app/attention")
    assert response.status_code == 200
    assert response.json() == dataclasses.asdict(record)


def test_attention_answers_the_real_stats(client: TestClient) -> None:
    assert client.get("/api/v1/app/attention").json() == jsonable_encoder(attention_stats())


def test_the_attention_schema_is_the_record_field_for_field(client: TestClient) -> None:
    """No open maps where the record has fields: the schema names exactly the record's fields, each described,
    with probe, reports and events typed as records of their own."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for record in (AttentionStats, KernelProbe, AttentionReport, AttentionEvent):
        schema = schemas[record.__name__]
        assert sorted(schema["properties"]) == sorted(f.name for f in dataclasses.fields(record))
        assert schema.get("additionalProperties") in (None, False)
        assert all(prop.get("description") for prop in schema["properties"].values()), record.__name__
    stats = schemas["AttentionStats"]["properties"]
    assert stats["reports"]["items"] == {"$ref": "#/components/schemas/AttentionReport"}
    assert stats["events"]["items"] == {"$ref": "#/components/schemas/AttentionEvent"}
    assert {"$ref": "#/components/schemas/KernelProbe"} in stats["probe"]["anyOf"]
