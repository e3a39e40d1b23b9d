"""The optional bearer token (the api_token setting) that every API request and event stream must carry."""

from __future__ import annotations

import hashlib
import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from invokeai.app.api.dependencies import Config

# auto_error=False: without a token configured, a request without the header is fine; require_token decides.
_bearer = HTTPBearer(auto_error=False, description="Needed when the server's api_token setting is set.")


def _digest(token: bytes) -> bytes:
    # Comparing fixed-length digests keeps compare_digest's time independent of the token's length as well.
    return hashlib.sha256(token).digest()


def require_token(
    config: Config, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """401 unless the api_token setting is empty or the request sends `Authorization: Bearer <api_token>`."""
    if not config.api_token:
        return
    # Header values arrive decoded as latin-1 (HTTP's own encoding); encoding back gives the bytes that were sent,
    # so a non-ASCII token sent as UTF-8 matches.
    given = credentials.credentials.encode("latin-1") if credentials is not None else b""
    if not secrets.compare_digest(_digest(given), _digest(config.api_token.encode("utf-8"))):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="a valid 'Authorization: Bearer <token>' header is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
