"""The optional bearer token (the api_token setting) that every API request and event stream must carry.

It is checked by an ASGI middleware in front of every route under /api/, before anything reads the request body:
a client without the token learns nothing from the server, not even whether its body would parse. The routers
still declare the bearer scheme (`BEARER`) so that the OpenAPI document describes it. Nothing else under / is
guarded here: the web UI's page and assets must load without the token, so that the page can ask the user for it.
The Socket.IO server (/ws/socket.io) checks the same token in its own handshake (sockets.py), with token_matches.
"""

from __future__ import annotations

import hashlib
import secrets

from fastapi import status
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

API_PATH_PREFIX = "/api/"

# auto_error=False: it only describes the scheme; TokenMiddleware decides.
BEARER = HTTPBearer(auto_error=False, description="Needed when the server's api_token setting is set.")


def _digest(token: bytes) -> bytes:
    # Comparing fixed-length digests keeps compare_digest's time independent of the token's length as well.
    return hashlib.sha256(token).digest()


def expected_digest(token: str) -> bytes | None:
    """What a request's token is compared with; None when the setting is empty and no token is needed."""
    return _digest(token.encode("utf-8")) if token else None


def token_matches(expected: bytes | None, given: bytes) -> bool:
    return expected is None or secrets.compare_digest(_digest(given), expected)


def bearer_token(scope: Scope) -> bytes:
    """The credentials of the first `Authorization: Bearer <credentials>` header, as the bytes that were sent
    (a non-ASCII token sent as UTF-8 then matches), or b"" for none or another scheme."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credentials = value.partition(b" ")
            return credentials.strip() if scheme.lower() == b"bearer" else b""
    return b""


class TokenMiddleware:
    """401 for any request under /api/ unless the token is empty or the request sends `Authorization: Bearer
    <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = expected_digest(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self._expected is not None
            and scope["type"] == "http"
            and scope["path"].startswith(API_PATH_PREFIX)
            and not token_matches(self._expected, bearer_token(scope))
        ):
            response = JSONResponse(
                {"detail": "a valid 'Authorization: Bearer <token>' header is required"},
                status_code=status.HTTP_401_UNAUTHORIZED,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
