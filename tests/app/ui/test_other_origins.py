"""Pages of other origins get nothing (request_guard.py, security_headers.py), in Chromium against a real
invokeai-web with no api_token: a page served from another 127.0.0.1 port tries a form POST to enqueue_batch, a
no-cors multipart upload, a Socket.IO WebSocket and an iframe of the UI; a rebinding-style name reaches the server;
each is refused and nothing changes. And /docs works offline under its policy."""

from __future__ import annotations

import base64
import http.server
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from playwright.sync_api import Browser, Page, Response, expect
from web_server import WebServer, free_port

QUEUE = "/api/v1/queue/default"
# A page of another origin, as an attacker would write it: none of these needs the server's consent (no CORS
# preflight), so only the server can refuse them. The form's text/plain body is JSON text: {"batch": ..., "x": "="}.
ATTACK_PAGE = """<!doctype html><meta charset="utf-8"><title>another origin</title>
<iframe id="ui" name="ui" src="TARGET/" width="640" height="400"></iframe>
<iframe name="sink"></iframe>
<form id="f" method="POST" action="TARGET/api/v1/queue/default/enqueue_batch" enctype="text/plain" target="sink">
<input type="hidden" name='{"batch": {"runs": 1, "graph": {"id": "cross", "nodes": {"n": {"id": "n",
"type": "blank_image", "width": 8, "height": 8}}, "edges": []}}, "x": "' value='"}'></form>
<script>
window.results = {};
(async () => {
  const bytes = Uint8Array.from(atob("PNG_B64"), (ch) => ch.charCodeAt(0));
  const form = new FormData();
  form.append("file", new Blob([bytes], {type: "image/png"}), "cross-origin.png");
  await fetch("TARGET/api/v1/images/upload", {method: "POST", mode: "no-cors", body: form});
  results.socket = await new Promise((resolve) => {
    const socket = new WebSocket("TARGET/ws/socket.io/?EIO=4&transport=websocket".replace(/^http/, "ws"));
    socket.onopen = () => resolve("open");
    socket.onerror = () => resolve("refused");
  });
  document.getElementById("f").submit();
  results.done = true;
})();
</script>"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    # No models: nothing here generates, and the start is quicker without them.
    with WebServer.running(tmp_path_factory.mktemp("other-origins"), install_demo_models="false") as server:
        yield server


def _png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def _serve(html: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    """`html` at / of another origin: 127.0.0.1 on a port of its own."""
    body = html.encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    return site, f"http://127.0.0.1:{site.server_address[1]}"


def _state(base: str) -> tuple[int, int]:
    """(images, queue items) as the server counts them; a client that is not a browser (no Origin) may read."""
    images = httpx.get(f"{base}/api/v1/images/", params={"limit": 0}).json()["total"]
    items = httpx.get(f"{base}{QUEUE}/status").json()["queue"]["total"]
    return images, items


def test_a_page_of_another_origin_changes_nothing(server: WebServer, browser: Browser, tmp_path: Path) -> None:
    before = _state(server.base)
    site, origin = _serve(ATTACK_PAGE.replace("TARGET", server.base).replace("PNG_B64", _png()))
    # A context of its own: the page fixture's context refuses any name but 127.0.0.1 and localhost, and the
    # rebinding-style name below is one (Chromium resolves every *.localhost name to this machine).
    context = browser.new_context()
    try:
        page = context.new_page()
        answers: list[tuple[str, str, int]] = []
        page.on("response", lambda r: answers.append((r.request.method, r.url, r.status)))
        # The form is sent last: its answer means the page has done everything.
        with page.expect_response(lambda r: r.url.endswith("/enqueue_batch")):
            page.goto(origin + "/")
        results = page.evaluate("() => window.results")

        # The server said no to each write (the page cannot read these answers; the browser saw them).
        posts = {url.removeprefix(server.base): status for method, url, status in answers if method == "POST"}
        assert posts == {"/api/v1/images/upload": 403, f"{QUEUE}/enqueue_batch": 403}, answers
        assert results["socket"] == "refused"
        # The UI did not render in the frame: Chromium refused it (frame-ancestors 'none', X-Frame-Options).
        frame = page.frame(name="ui")
        assert frame is not None and not frame.url.startswith(server.base), frame and frame.url
        assert frame.evaluate("() => document.getElementById('app')") is None

        # DNS rebinding: a name that resolves to this machine but that the server does not answer to.
        rebound = page.goto(f"http://rebound.localhost:{server.port}/")
        assert rebound is not None and rebound.status == 400, rebound and rebound.text()
        assert "allowed_hosts" in rebound.text()
    finally:
        context.close()
        site.shutdown()
    assert _state(server.base) == before


def test_docs_work_offline_under_their_policy(server: WebServer, page: Page) -> None:
    """Swagger UI from this server only (the page fixture fails on a request elsewhere, and on a CSP violation)."""
    loaded: list[Response] = []
    page.on("response", lambda response: loaded.append(response))
    page.goto(server.base + "/docs")
    # The document is large (every node's schema): Swagger UI takes seconds to render it on a busy machine.
    expect(page.locator(".swagger-ui .opblock-summary").first).to_be_visible(timeout=60_000)
    expect(page.locator(".swagger-ui .title").first).to_contain_text("InvokeAI")
    failed = [(response.url, response.status) for response in loaded if response.status >= 400]
    assert loaded and not failed, failed
