"""The api_token setting: off by default; when set, every API route needs the bearer token, compared exactly."""

from __future__ import annotations

import pytest
from api_support import MakeClient
from fastapi.testclient import TestClient

TOKEN = "s3cr3t-token-\u00e9"  # non-ASCII: compared as UTF-8 bytes
ROUTES = [
    ("GET", "/api/v1/app/version"),
    ("GET", "/api/v1/app/config"),
    ("GET", "/api/v1/app/attention"),
    ("GET", "/api/v1/queue/default/status"),
    ("GET", "/api/v1/queue/default/list"),
    ("PUT", "/api/v1/queue/default/prune"),
    ("POST", "/api/v1/queue/default/enqueue_batch"),
    ("GET", "/api/v1/queue/default/events"),
    ("GET", "/api/v1/images/"),
    ("GET", "/api/v1/images/i/0123456789abcdef0123456789abcdef.png/full"),
    ("POST", "/api/v1/images/upload"),
]


@pytest.fixture
def guarded(make_client: MakeClient) -> TestClient:
    return make_client(api_token=TOKEN, run_processor=False)


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "header",
    [None, "Bearer wrong", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", "Bearer ", f"Bearer {TOKEN}x"],
    ids=["none", "wrong", "prefix", "basic", "empty", "longer"],
)
def test_every_route_needs_the_token(guarded: TestClient, method: str, path: str, header: str | None) -> None:
    headers = {"Authorization": header.encode("utf-8")} if header else {}
    response = guarded.request(method, path, headers=headers)  # type: ignore[arg-type]
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert TOKEN not in response.text


def test_the_right_token_is_let_through(guarded: TestClient) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}".encode()}
    assert guarded.get("/api/v1/app/version", headers=headers).status_code == 200  # type: ignore[arg-type]
    assert guarded.get("/api/v1/queue/default/status", headers=headers).status_code == 200  # type: ignore[arg-type]


def test_the_token_is_not_in_the_config_answer(guarded: TestClient) -> None:
    response = guarded.get("/api/v1/app/config", headers={"Authorization": f"Bearer {TOKEN}".encode()})  # type: ignore[dict-item]
    assert response.status_code == 200
    assert "api_token" not in response.json()["config"]
    assert TOKEN not in response.text


def test_without_a_token_setting_no_header_is_needed(client: TestClient) -> None:
    assert client.get("/api/v1/queue/default/status").status_code == 200
    assert client.get("/api/v1/app/version", headers={"Authorization": "Bearer anything"}).status_code == 200


def test_the_openapi_document_declares_the_bearer_scheme(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "Needed when the server's api_token setting is set.",
    }
