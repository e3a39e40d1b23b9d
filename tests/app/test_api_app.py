"""GET /api/v1/app/version, config, runtime_config, app_deps, logging and attention, in process."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import torch
from fastapi.encoders import jsonable_encoder
from fastapi.testclient import TestClient
from web_server import LOCAL_BASE_URL

import invokeai
from invokeai.app import version as version_module
from invokeai.app.api.app_factory import create_app
from invokeai.app.api.routers import app as app_router
from invokeai.app.config import CliArgs, load_config
from invokeai.app.config.describe import SETTINGS, secret_settings
from invokeai.backend.attention import AttentionStats, attention_stats
from invokeai.backend.attention.kernel_probe import KernelProbe
from invokeai.backend.attention.stats import AttentionEvent, AttentionReport


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setenv("INVOKEAI_ATTENTION_BACKEND", "efficient")
    (tmp_path / "invokeai.yaml").write_text("port: 9100\nmodels_dir: /data/models\n")
    return TestClient(create_app(load_config(CliArgs(root=tmp_path)).config), base_url=LOCAL_BASE_URL)


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


def test_runtime_config_is_invokeais_set_fields_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOKEAI_ATTENTION_BACKEND", "efficient")
    monkeypatch.setenv("INVOKEAI_API_TOKEN", "a-secret-token")
    (tmp_path / "invokeai.yaml").write_text("port: 9100\n")
    client = TestClient(create_app(load_config(CliArgs(root=tmp_path)).config), base_url=LOCAL_BASE_URL)
    headers = {"Authorization": "Bearer a-secret-token"}
    response = client.get("/api/v1/app/runtime_config", headers=headers)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"set_fields", "config"}
    # What the file and the environment gave; not the defaults.
    assert {"port", "attention_backend", "api_token"} <= set(body["set_fields"]) and "host" not in body["set_fields"]
    assert body["config"]["port"] == 9100 and body["config"]["host"] == "127.0.0.1"
    assert set(body["config"]) == set(SETTINGS) - secret_settings()
    assert "a-secret-token" not in response.text


def test_app_deps_names_each_installed_distribution_with_its_version(client: TestClient) -> None:
    response = client.get("/api/v1/app/app_deps")
    assert response.status_code == 200
    deps = response.json()
    for name in ("torch", "diffusers", "transformers", "fastapi", "pydantic"):
        assert deps[name] == installed_version(name), name
    assert deps["CUDA"] == (torch.version.cuda or "N/A")
    assert list(deps) == sorted(deps, key=str.lower)


@pytest.fixture
def root_log_level() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    try:
        yield
    finally:
        root.setLevel(level)


@pytest.mark.usefixtures("root_log_level")
def test_logging_reads_and_sets_the_servers_log_level(client: TestClient) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    assert client.get("/api/v1/app/logging").json() == 30
    response = client.post("/api/v1/app/logging", json=10)  # a bare number, as InvokeAI's
    assert response.status_code == 200 and response.json() == 10
    assert logging.getLogger().level == logging.DEBUG and logging.getLogger("invokeai.app").isEnabledFor(10)
    assert client.get("/api/v1/app/logging").json() == 10
    for bad in (15, "debug", {"level": 10}, None):
        refused = client.post("/api/v1/app/logging", json=bad)
        assert refused.status_code == 422, bad
        assert refused.json()["detail"][0]["loc"] == ["body"]
    assert logging.getLogger().level == logging.DEBUG


def test_openapi_lists_the_app_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/api/v1/app/version", "/api/v1/app/config"} <= set(paths)


def test_attention_answers_the_attention_packages_record(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    record = AttentionStats(
        setting="flash",
        installed=True,
        device="cuda:0",
        order=["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"],
        order_reason="attention_backend 'flash' pins the flash kernel first, then auto's order; sm89: ...",
        ranked_for="sm89, cuDNN 9.16.0",
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


def test_attention_tells_the_order_and_why_it_was_ranked_so(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from invokeai.backend.attention import install_attention, policy
    from invokeai.backend.attention.testing import pristine_attention

    with pristine_attention():
        install_attention("efficient", device="cpu")
        body = client.get("/api/v1/app/attention").json()
        assert body["order"][0] == "EFFICIENT_ATTENTION"
        assert body["ranked_for"] == "cpu"
        assert body["order_reason"].startswith("attention_backend 'efficient' pins the memory-efficient kernel first")
        assert "cpu: PyTorch picks the kernel itself" in body["order_reason"]

        # A stand-in Hopper with cuDNN 9.16: cuDNN first, as PyTorch ranks it, with the measurement that says why.
        real = policy.device_facts
        monkeypatch.setattr(policy, "device_facts", lambda device, capability, cudnn: real(None, (9, 0), 91600))
        monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", raising=False)
        install_attention("auto", device="cpu")
        body = client.get("/api/v1/app/attention").json()
    assert body["order"] == ["CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]
    assert body["ranked_for"] == "sm90, cuDNN 9.16.0"
    assert "pytorch#142132" in body["order_reason"] and "631" in body["order_reason"]


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
