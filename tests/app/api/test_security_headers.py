"""The headers of each kind of answer (invokeai/app/api/security_headers.py), /docs served offline (docs_page.py),
and paths holding a control character answered with 404. Chromium runs the pages under these policies in
tests/app/ui (any CSP violation fails those tests)."""

from __future__ import annotations

import base64
import hashlib
import io
import re
from pathlib import Path

import pytest
from api_support import MakeClient
from fastapi.testclient import TestClient
from PIL import Image

from invokeai.app.api.routers.images import IMAGE_CACHE_CONTROL
from invokeai.app.api.security_headers import BUILTIN_UI_POLICY, INVOKEAI_UI_POLICY
from invokeai.app.api.web_ui import WEB_UI_DIR

HASHED_ASSET = next((WEB_UI_DIR / "assets").glob("*.js")).relative_to(WEB_UI_DIR).as_posix()


def _directives(policy: str) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in policy.split(";"))


def test_the_ui_page_forbids_framing_inline_scripts_and_other_origins(client: TestClient) -> None:
    for path in ("/", "/gallery"):
        response = client.get(path)
        assert response.headers["content-security-policy"] == BUILTIN_UI_POLICY
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
    policy = _directives(BUILTIN_UI_POLICY)
    assert policy["default-src"] == policy["script-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"
    assert "unsafe" not in BUILTIN_UI_POLICY


def test_invokeais_frontend_gets_the_policy_it_runs_under(make_client: MakeClient, tmp_path: Path) -> None:
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "index.html").write_text("<html>InvokeAI</html>")
    client = make_client(web_ui=f"invokeai:{tmp_path / 'dist'}", run_processor=False)
    response = client.get("/")
    assert response.headers["content-security-policy"] == INVOKEAI_UI_POLICY
    assert response.headers["x-frame-options"] == "DENY"
    policy = _directives(INVOKEAI_UI_POLICY)
    # Inline styles (Chakra UI writes <style> elements); never inline or foreign scripts.
    assert policy["script-src"] == "'self'" and policy["frame-ancestors"] == "'none'"


def test_assets_are_not_pages(client: TestClient) -> None:
    response = client.get("/" + HASHED_ASSET)
    assert response.headers["x-content-type-options"] == "nosniff"
    # A CSP on a script would bind a worker started from it; assets get none.
    assert "content-security-policy" not in response.headers and "x-frame-options" not in response.headers


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/api/v1/app/version", 200),
        ("GET", "/api/v1/queue/default/status", 200),
        ("GET", "/api/v1/no-such-path", 404),
        ("POST", "/api/v1/app/version", 405),
        ("GET", "/api/v1/images/?limit=-1", 422),
        ("GET", "/openapi.json", 200),
    ],
)
def test_api_answers_are_never_stored_nor_sniffed(client: TestClient, method: str, path: str, status: int) -> None:
    response = client.request(method, path)
    assert response.status_code == status
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["x-content-type-options"] == "nosniff"


def test_image_files_are_cached_privately_for_good(client: TestClient) -> None:
    # Written once under a new name, never changed: a gallery fetches each once.
    data = io.BytesIO()
    Image.new("RGB", (8, 8), "blue").save(data, format="PNG")
    uploaded = client.post("/api/v1/images/upload", files={"file": ("a.png", data.getvalue(), "image/png")})
    name = uploaded.json()["image_name"]
    assert uploaded.headers["cache-control"] == "no-store"
    for kind in ("full", "thumbnail"):
        response = client.get(f"/api/v1/images/i/{name}/{kind}")
        assert response.status_code == 200
        assert response.headers["cache-control"] == IMAGE_CACHE_CONTROL
        assert response.headers["x-content-type-options"] == "nosniff"
    assert IMAGE_CACHE_CONTROL.startswith("private,")


def test_the_docs_page_is_served_offline_under_a_policy(client: TestClient) -> None:
    response = client.get("/docs")
    assert response.status_code == 200 and response.headers["x-frame-options"] == "DENY"
    html = response.text
    assert not re.findall(r"https?://|//cdn", html), "the page names another host"
    scripts = re.findall(r"<script>(.*?)</script>", html, re.DOTALL)
    digests = {f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in scripts}
    policy = _directives(response.headers["content-security-policy"])
    # Exactly its own inline script is allowed, by hash: no other inline script could run.
    assert scripts and policy["script-src"].split() == ["'self'", *sorted(digests)]
    assert policy["frame-ancestors"] == "'none'" and "unsafe" not in response.headers["content-security-policy"]
    files = re.findall(r"""(?:src|href)="([^"]+)""", html)
    assert {Path(f).name for f in files} == {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}
    for file in files:
        answer = client.get(file)
        assert answer.status_code == 200 and len(answer.content) > 1000, file
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_redoc_is_not_served(client: TestClient) -> None:
    # One interactive page; /redoc is a path of the web UI like any other.
    assert "redoc" not in client.get("/redoc").text.lower()


@pytest.mark.parametrize(
    "path", ["/%00", "/assets/x%00.js", "/gallery%01", "/%7f", "/docs/assets/x%00.js", "/api/v1/images/i/%00/full"]
)
def test_a_path_holding_a_control_character_is_404(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert "detail" in response.json()
