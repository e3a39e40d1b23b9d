"""/docs, Swagger UI, served whole by this server so that it works offline: FastAPI's page names a CDN for Swagger
UI's script and style, which an offline machine cannot reach (a blank page). The files come from the
fastapi-offline package (swagger-ui-dist 5, which reads OpenAPI 3.1), served under /docs/assets/; the page is
FastAPI's own. Its one inline script (the SwaggerUIBundle call) is allowed by its hash, so the page's policy still
forbids any other inline script. ReDoc (/redoc) is not served: one interactive page is enough.
"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from invokeai.app.api.security_headers import content_security_policy, page_headers

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
ASSETS_PACKAGE = ("fastapi_offline", "static")
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)


def _script_hashes(html: bytes) -> str:
    """The CSP sources allowing exactly the page's inline scripts."""
    digests = (hashlib.sha256(script).digest() for script in _INLINE_SCRIPT.findall(html))
    return " ".join(f"'sha256-{base64.b64encode(digest).decode()}'" for digest in digests)


def serve_docs(app: FastAPI) -> None:
    """Serve /docs and its files (create the app with docs_url=None, so that FastAPI's own page is not served)."""
    assert app.openapi_url is not None
    page = get_swagger_ui_html(
        openapi_url=app.openapi_url,
        title=f"{app.title} - Swagger UI",
        swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
        oauth2_redirect_url=None,
        swagger_ui_parameters=app.swagger_ui_parameters,
    ).body
    # Swagger UI's stylesheet draws its icons from data: SVGs.
    policy = content_security_policy(script_src=f"'self' {_script_hashes(page)}", img_src="'self' data:")
    headers = page_headers(policy)
    app.mount(ASSETS_PATH, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-assets")

    @app.get(DOCS_PATH, include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(page, headers=headers)
