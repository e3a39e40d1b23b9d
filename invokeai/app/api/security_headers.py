"""The headers that tell a browser how to treat this server's answers, by the kind of answer (docs/api.md,
Security):

- every answer: `X-Content-Type-Options: nosniff` (a browser takes the declared type, never guesses a script);
- API answers (under /api/, and /openapi.json): `Cache-Control: no-store`, unless the route sets its own: image
  files are written once under a new name and never change, so they are cached (routers/images.py), and the event
  stream says no-cache;
- HTML pages (the web UI, /docs): a Content-Security-Policy, the page's own (below) or PAGE_POLICY, and
  `X-Frame-Options: DENY`. Both forbid framing by any page (clickjacking); the policy allows no inline script and
  nothing from another origin.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from invokeai.app.api.auth import API_PATH_PREFIX

OPENAPI_PATH = "/openapi.json"
NO_STORE = "no-store"

_BASE = {
    "default-src": "'self'",
    "script-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}


def content_security_policy(**directives: str) -> str:
    """_BASE with `directives` added or replaced (underscores for dashes: img_src="'self' data:")."""
    merged = {**_BASE, **{name.replace("_", "-"): value for name, value in directives.items()}}
    return "; ".join(f"{name} {value}" for name, value in merged.items())


# Any HTML page that declares nothing of its own.
PAGE_POLICY = content_security_policy()
# This server's web UI (web/): its images are fetched with the token and shown from blob: URLs (AuthImage.tsx).
# Preact sets `style` props through the CSSOM, which style-src does not govern.
BUILTIN_UI_POLICY = content_security_policy(img_src="'self' blob: data:")
# InvokeAI 6.14.2's built frontend (web_ui: invokeai:<folder>), as strict as it runs under: Chakra UI (emotion)
# writes <style> elements and index.html has one, so styles may be inline; its canvas makes blob: and data: images
# and reads them back with fetch; its canvas worker is a file of its own. 'self' covers its Socket.IO WebSocket.
INVOKEAI_UI_POLICY = content_security_policy(
    style_src="'self' 'unsafe-inline'",
    img_src="'self' blob: data:",
    media_src="'self' blob: data:",
    font_src="'self' data:",
    connect_src="'self' blob: data:",
    worker_src="'self' blob:",
)


def page_headers(policy: str) -> dict[str, str]:
    """The headers of an HTML page served under `policy`."""
    return {"Content-Security-Policy": policy, "X-Frame-Options": "DENY"}


class SecurityHeaders:
    """Adds the headers of the module docstring to every HTTP answer, leaving those a route set."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        is_api = path.startswith(API_PATH_PREFIX) or path == OPENAPI_PATH

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                if is_api:
                    headers.setdefault("Cache-Control", NO_STORE)
                if headers.get("content-type", "").startswith("text/html"):
                    for name, value in page_headers(PAGE_POLICY).items():
                        headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)
