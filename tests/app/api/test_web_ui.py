"""The web UI at /: the committed build (invokeai/app/web_ui/) served as it is, with its content types and cache
headers, index.html for the page's own paths, no token needed for it, and every API path answering as before."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from api_support import MakeClient
from fastapi import FastAPI
from fastapi.testclient import TestClient
from web_server import LOCAL_BASE_URL

from invokeai.app.api.web_ui import IMMUTABLE, REVALIDATE, WEB_UI_DIR, serve_web_ui

INDEX = WEB_UI_DIR / "index.html"
ASSETS = sorted(path for path in (WEB_UI_DIR / "assets").rglob("*") if path.is_file())
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def test_the_build_is_there() -> None:
    assert INDEX.is_file(), f"{INDEX} is missing: run `npm ci && npm run build` in web/"
    assert ASSETS, "the build has no assets/"


def test_index_html_names_only_files_of_the_build() -> None:
    named = re.findall(r"""(?:src|href)=["'](/[^"'#?]+)""", INDEX.read_text(encoding="utf-8"))
    assert any(name.endswith(".js") for name in named), named
    missing = [name for name in named if not (WEB_UI_DIR / name.lstrip("/")).is_file()]
    assert not missing


def test_the_page_is_served_at_the_root_and_revalidated(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["cache-control"] == REVALIDATE
    assert response.content == INDEX.read_bytes()


@pytest.mark.parametrize("asset", ASSETS, ids=lambda path: path.name)
def test_every_asset_is_served_with_its_type_and_cached_for_good(client: TestClient, asset: Path) -> None:
    response = client.get("/" + asset.relative_to(WEB_UI_DIR).as_posix())
    assert response.status_code == 200
    assert response.content == asset.read_bytes()
    assert response.headers["cache-control"] == IMMUTABLE
    assert response.headers["x-content-type-options"] == "nosniff"
    if asset.suffix in TYPES:
        assert response.headers["content-type"] == TYPES[asset.suffix]


@pytest.mark.parametrize("path", ["/gallery", "/queue/", "/models/some/deep/path", "/index.htm", "/%2e%2e/auth.py"])
def test_other_paths_get_the_page(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.content == INDEX.read_bytes()
    assert response.headers["cache-control"] == REVALIDATE


def test_head_answers_without_a_body(client: TestClient) -> None:
    response = client.head("/")
    assert response.status_code == 200
    assert response.content == b""
    assert int(response.headers["content-length"]) == INDEX.stat().st_size


def test_a_missing_asset_is_a_404_not_the_page(client: TestClient) -> None:
    response = client.get("/assets/index-deadbeef.js")
    assert response.status_code == 404
    assert response.json() == {"detail": "no such file of the web UI: /assets/index-deadbeef.js"}


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/api/v1/nothing-here", 404),
        ("GET", "/api/v2/models/nothing/here", 404),
        ("POST", "/", 404),
        ("DELETE", "/gallery", 404),
        ("POST", "/api/v1/app/version", 405),
    ],
)
def test_api_answers_are_unchanged(client: TestClient, method: str, path: str, status: int) -> None:
    response = client.request(method, path)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert "detail" in response.json()


def test_openapi_and_docs_still_answer(client: TestClient) -> None:
    document = client.get("/openapi.json")
    assert document.status_code == 200
    assert document.json()["info"]["title"] == "InvokeAI"
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "swagger-ui" in docs.text
    assert docs.content != INDEX.read_bytes()
    assert client.get("/api/v1/app/version").status_code == 200


def test_the_page_needs_no_token_but_the_api_does(make_client: MakeClient) -> None:
    guarded = make_client(api_token="s3cret", run_processor=False)
    assert guarded.get("/").status_code == 200
    assert guarded.get("/gallery").status_code == 200
    for asset in ASSETS:
        assert guarded.get("/" + asset.relative_to(WEB_UI_DIR).as_posix()).status_code == 200
    assert guarded.get("/api/v1/app/version").status_code == 401
    assert guarded.get("/api/v1/nothing-here").status_code == 401


def test_without_a_build_the_answer_says_how_to_make_one(tmp_path: Path) -> None:
    app = FastAPI()
    serve_web_ui(app, tmp_path)
    with TestClient(app, base_url=LOCAL_BASE_URL) as bare:
        response = bare.get("/")
    assert response.status_code == 404
    assert "npm run build" in response.json()["detail"]
    assert str(tmp_path / "index.html") in response.json()["detail"]


def test_web_ui_invokeai_serves_that_folder_instead(make_client: MakeClient, tmp_path: Path) -> None:
    """web_ui: invokeai:<folder> serves another build (InvokeAI's own frontend) at /, by the same rules: its files,
    its hashed assets cached for good, index.html for the page's own paths; the API answers as before."""
    folder = tmp_path / "dist"
    (folder / "assets").mkdir(parents=True)
    (folder / "index.html").write_text("<html>another UI</html>")
    (folder / "assets" / "index-abc123.js").write_text("console.log(1)")
    (folder / "locales").mkdir()
    (folder / "locales" / "en.json").write_text("{}")
    client = make_client(web_ui=f"invokeai:{folder}")
    assert client.get("/").text == "<html>another UI</html>"
    assert client.get("/workflows/some-page").text == "<html>another UI</html>"
    asset = client.get("/assets/index-abc123.js")
    assert asset.text == "console.log(1)" and asset.headers["cache-control"] == IMMUTABLE
    assert client.get("/locales/en.json").headers["content-type"] == "application/json"
    assert client.get("/assets/index-gone.js").status_code == 404
    assert client.get("/api/v1/app/version").status_code == 200
    assert client.get("/api/v1/nothing-here").status_code == 404
    # The built-in UI's files are not served beside it.
    assert client.get("/" + ASSETS[0].relative_to(WEB_UI_DIR).as_posix()).status_code == 404


def test_what_invokeai_web_ui_asks_first(client: TestClient) -> None:
    """InvokeAI's web UI asks these before it shows anything: no sign-up or login (one user), no PatchMatch."""
    status = client.get("/api/v1/auth/status")
    assert status.status_code == 200
    assert status.json() == {
        "setup_required": False,
        "multiuser_enabled": False,
        "strict_password_checking": False,
        "admin_email": None,
    }
    assert client.get("/api/v1/app/patchmatch_status").json() is False
