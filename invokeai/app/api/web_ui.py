"""The web UI: the committed build of web/ (invokeai/app/web_ui/, package data) served at `/`.

It answers only what no route of the app matches (it is the router's fallback), so /api/*, /openapi.json and /docs
answer exactly as without it, their 404s and 405s included. The token middleware guards /api/ only: the page and
its assets load without a token, so the page can ask for it. The page is served under a Content-Security-Policy
that fits the UI it is (security_headers.py): this server's own, or InvokeAI's frontend.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, status
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from invokeai.app.api.auth import API_PATH_PREFIX
from invokeai.app.api.security_headers import BUILTIN_UI_POLICY, page_headers

WEB_UI_DIR = Path(__file__).resolve().parent.parent / "web_ui"
INDEX = "index.html"
# Vite writes every file it names by content hash under assets/: a changed file gets a new name, so a cached one
# never goes stale. index.html names them, so the browser must ask for it again every time.
HASHED_DIR = "assets"
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
# Set here rather than taken from the mimetypes module, whose answers depend on the machine's /etc/mime.types.
# Starlette adds charset=utf-8 to the text/ types.
CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".map": "application/json",
    ".webmanifest": "application/manifest+json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".webp": "image/webp",
    ".ico": "image/x-icon",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".ttf": "font/ttf",
    ".wasm": "application/wasm",
    ".txt": "text/plain",
}


def _has_control_character(path: str) -> bool:
    return any(ord(char) < 0x20 or ord(char) == 0x7F for char in path)


class WebUI:
    """An ASGI app for GET and HEAD: a file of `directory` by its path, or index.html for any other path (the
    page's own routes), except under /api/ and under assets/, where a missing file is a 404 (a stale chunk name
    must not be answered with HTML), and for a path holding a control character (`/%00`), which names neither a
    file nor a page: a 404, before the file system sees it (a NUL byte makes its calls raise). Anything else is
    handed to `otherwise` (the router's own 404 or 405). index.html goes out with the headers of a page under
    `policy`."""

    def __init__(self, directory: Path, otherwise: ASGIApp, policy: str = BUILTIN_UI_POLICY) -> None:
        self.directory = directory.resolve()
        self.otherwise = otherwise
        self.page_headers = page_headers(policy)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_page = scope["type"] == "http" and scope["method"] in ("GET", "HEAD")
        if not is_page or scope["path"].startswith(API_PATH_PREFIX):
            await self.otherwise(scope, receive, send)
            return
        file = self._file_for(scope["path"].lstrip("/"))
        hashed = file.relative_to(self.directory).parts[0] == HASHED_DIR
        headers = {"Cache-Control": IMMUTABLE if hashed else REVALIDATE}
        if file == self.directory / INDEX:
            headers.update(self.page_headers)
        response = FileResponse(
            file, media_type=CONTENT_TYPES.get(file.suffix.lower(), "application/octet-stream"), headers=headers
        )
        await response(scope, receive, send)

    def _file_for(self, relative: str) -> Path:
        index = self.directory / INDEX
        if not index.is_file():
            raise HTTPException(
                status.HTTP_404_NOT_FOUND,
                f"the web UI is not built: {index} is missing (run `npm ci && npm run build` in web/)",
            )
        if _has_control_character(relative):
            raise HTTPException(status.HTTP_404_NOT_FOUND, "no file or page of the web UI has a control character")
        candidate = (self.directory / relative).resolve()
        if candidate.is_file() and candidate.is_relative_to(self.directory):
            return candidate
        if relative.split("/", 1)[0] == HASHED_DIR:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no such file of the web UI: /{relative}")
        return index


def serve_web_ui(app: FastAPI, directory: Path = WEB_UI_DIR, policy: str = BUILTIN_UI_POLICY) -> None:
    """Answer with the UI what none of `app`'s routes match; the router's own fallback still answers the rest."""
    app.router.default = WebUI(directory, app.router.default, policy)
