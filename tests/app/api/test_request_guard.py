"""The requests refused before any route (invokeai/app/api/request_guard.py): a Host the server does not answer to
(400, against DNS rebinding), and a write from a browser page of another origin (403, against cross-site request
forgery), Socket.IO included; clients that are not browsers are not affected. The browser's side of it, in Chromium:
tests/app/ui/test_other_origins.py."""

from __future__ import annotations

import io
import socket
from typing import Any

import pytest
from api_support import IMAGE_GRAPH, QUEUE, MakeClient, enqueue
from fastapi.testclient import TestClient
from PIL import Image
from starlette.websockets import WebSocketDisconnect

from invokeai.app.config import CliArgs, load_config

OWN = "http://localhost"  # the test client's base URL (tests/web_server.py), so the server's own origin
OTHER = "http://127.0.0.1:5555"
IMAGES = "/api/v1/images/"
POLLING = "/ws/socket.io/?EIO=4&transport=polling"
WEBSOCKET = "/ws/socket.io/?EIO=4&transport=websocket"


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(out, format="PNG")
    return out.getvalue()


def _upload(client: TestClient, **headers: str) -> Any:
    return client.post(f"{IMAGES}upload", files={"file": ("a.png", _png(), "image/png")}, headers=headers)


def _counts(client: TestClient) -> tuple[int, int]:
    return client.get(IMAGES, params={"limit": 0}).json()["total"], client.get(f"{QUEUE}/status").json()["queue"][
        "total"
    ]


# --- Host -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/app/version", "/", "/docs", POLLING])
def test_a_host_the_server_does_not_answer_to_is_refused_with_400(client: TestClient, path: str) -> None:
    response = client.get(path, headers={"host": "attacker.example"})
    assert response.status_code == 400
    assert "'attacker.example'" in response.json()["detail"] and "allowed_hosts" in response.json()["detail"]


def test_a_write_naming_another_host_changes_nothing(make_client: MakeClient) -> None:
    client = make_client(run_processor=False)
    body = {"batch": {"graph": IMAGE_GRAPH}}
    assert _upload(client, host="attacker.example:9090").status_code == 400
    assert client.post(f"{QUEUE}/enqueue_batch", json=body, headers={"host": "rebound.localhost"}).status_code == 400
    assert _counts(client) == (0, 0)
    # The same requests naming this server go through.
    assert _upload(client).status_code == 201 and enqueue(client, IMAGE_GRAPH).status_code == 200
    assert _counts(client) == (1, 1)


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:9090",
        "LOCALHOST:1",
        "localhost.",
        "127.0.0.1:9090",
        "[::1]:9090",
        "192.168.1.5",
        "10.0.0.7:80",
    ],
)
def test_localhost_and_any_ip_address_are_answered(client: TestClient, host: str) -> None:
    # An IP address names no DNS record, so no page can rebind it: a page reached by address is this server's own.
    assert client.get("/api/v1/app/version", headers={"host": host}).status_code == 200


@pytest.mark.parametrize("host", ["", "a:b:c", "[::1", "localhost:port", "user@localhost"])
def test_a_malformed_host_is_refused(client: TestClient, host: str) -> None:
    assert client.get("/api/v1/app/version", headers={"host": host}).status_code == 400


def test_the_configured_host_name_is_answered(make_client: MakeClient) -> None:
    client = make_client(host="mybox.lan")
    assert client.get("/api/v1/app/version", headers={"host": "MyBox.lan:9090"}).status_code == 200
    assert client.get("/api/v1/app/version", headers={"host": "other.lan:9090"}).status_code == 400


def test_serving_every_interface_answers_the_machines_host_name(make_client: MakeClient) -> None:
    client = make_client(host="0.0.0.0")
    assert client.get("/api/v1/app/version", headers={"host": f"{socket.gethostname()}:9090"}).status_code == 200
    assert client.get("/api/v1/app/version", headers={"host": "0.0.0.0:9090"}).status_code == 200
    assert client.get("/api/v1/app/version", headers={"host": "other.lan:9090"}).status_code == 400


def test_allowed_hosts_adds_names_and_subdomains(make_client: MakeClient) -> None:
    client = make_client(allowed_hosts=["mybox.lan", "*.example.com"])
    answers = {
        host: client.get("/api/v1/app/version", headers={"host": host}).status_code
        for host in ("mybox.lan", "a.example.com:8080", "b.a.example.com", "example.com", "badexample.com", "localhost")
    }
    assert answers == {
        "mybox.lan": 200,
        "a.example.com:8080": 200,
        "b.a.example.com": 200,
        "example.com": 400,
        "badexample.com": 400,
        "localhost": 200,
    }


def test_a_star_turns_the_host_check_off(make_client: MakeClient) -> None:
    client = make_client(allowed_hosts=["*"])
    assert client.get("/api/v1/app/version", headers={"host": "attacker.example"}).status_code == 200


# --- Origin -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin", [OTHER, "null", "https://localhost", "http://localhost:8080", "http://localhost.evil"]
)
def test_a_write_from_a_page_of_another_origin_is_refused_with_403(client: TestClient, origin: str) -> None:
    before = _counts(client)
    response = _upload(client, origin=origin)
    assert response.status_code == 403
    assert origin in response.json()["detail"] and "allowed_origins" in response.json()["detail"]
    body = {"batch": {"graph": IMAGE_GRAPH}}
    assert client.post(f"{QUEUE}/enqueue_batch", json=body, headers={"origin": origin}).status_code == 403
    assert _counts(client) == before


@pytest.mark.parametrize(
    ("method", "path"),
    [("PUT", f"{QUEUE}/clear"), ("DELETE", f"{IMAGES}i/x.png"), ("PATCH", f"{IMAGES}i/x.png"), ("POST", "/nowhere")],
)
def test_every_method_that_changes_something_is_checked(client: TestClient, method: str, path: str) -> None:
    assert client.request(method, path, headers={"origin": OTHER}).status_code == 403


def test_writes_from_the_servers_own_origin_go_through(client: TestClient) -> None:
    assert _upload(client, origin=OWN).status_code == 201
    assert _upload(client, origin=OWN, **{"sec-fetch-site": "same-origin"}).status_code == 201


@pytest.mark.parametrize(
    ("site", "status"), [("cross-site", 403), ("same-site", 403), ("same-origin", 201), ("none", 201)]
)
def test_without_origin_sec_fetch_site_decides(client: TestClient, site: str, status: int) -> None:
    assert _upload(client, **{"sec-fetch-site": site}).status_code == status


def test_clients_that_are_not_browsers_are_not_affected(client: TestClient) -> None:
    assert _upload(client).status_code == 201


def test_reads_from_another_origin_are_answered_but_not_shared(client: TestClient) -> None:
    # GET changes nothing; the browser keeps the answer from the page, since no CORS header allows it.
    response = client.get("/api/v1/app/version", headers={"origin": OTHER})
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers


def test_allowed_origins_lets_a_page_in_with_cors(make_client: MakeClient) -> None:
    client = make_client(allowed_origins=["http://localhost:5173", "http://ui.lan:80"])
    assert _upload(client, origin="http://localhost:5173").status_code == 201
    assert _upload(client, origin="http://ui.lan").status_code == 201  # the default port, written or not
    assert _upload(client, origin=OTHER).status_code == 403
    preflight = client.options(
        f"{QUEUE}/enqueue_batch",
        headers={
            "origin": "http://localhost:5173",
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    read = client.get("/api/v1/app/version", headers={"origin": "http://ui.lan"})
    assert read.headers["access-control-allow-origin"] == "http://ui.lan"


def test_the_origin_check_comes_before_the_token(make_client: MakeClient) -> None:
    client = make_client(api_token="secret")
    assert _upload(client, origin=OTHER, authorization="Bearer secret").status_code == 403
    assert _upload(client, origin=OWN, authorization="Bearer secret").status_code == 201


# --- Socket.IO --------------------------------------------------------------------------------------------------


def test_socketio_takes_pages_of_the_same_origins_as_rest(make_client: MakeClient) -> None:
    client = make_client(allowed_origins=["http://localhost:5173"])
    assert client.get(POLLING).status_code == 200  # not a browser
    assert client.get(POLLING, headers={"origin": OWN}).status_code == 200
    assert client.get(POLLING, headers={"origin": "http://localhost:5173"}).status_code == 200
    assert client.get(POLLING, headers={"origin": OTHER}).status_code == 400  # engine.io's own refusal


def test_a_websocket_from_a_page_of_another_origin_is_refused(client: TestClient) -> None:
    # TestClient's WebSockets always name "testserver": the Host is given.
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect(
            WEBSOCKET, headers={"host": "localhost", "origin": OTHER, "upgrade": "websocket"}
        ):
            pass
    assert refused.value.code == 1008 and "another origin" in refused.value.reason
    with client.websocket_connect(
        WEBSOCKET, headers={"host": "localhost", "origin": OWN, "upgrade": "websocket"}
    ) as own:
        assert own.receive_text().startswith("0{")  # engine.io's open packet


# --- Settings ---------------------------------------------------------------------------------------------------


def test_the_settings_are_read_from_the_environment_as_text(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOKEAI_ALLOWED_HOSTS", "MyBox.lan, *.example.com")
    monkeypatch.setenv("INVOKEAI_ALLOWED_ORIGINS", "[http://localhost:5173,https://ui.example.com]")
    config = load_config(CliArgs(root=tmp_path)).config
    assert config.allowed_hosts == ["mybox.lan", "*.example.com"]
    assert config.allowed_origins == ["http://localhost:5173", "https://ui.example.com"]
