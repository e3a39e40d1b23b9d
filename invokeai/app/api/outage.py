"""The API while the database cannot be reached: every request that needs it is answered 503 with a JSON body and
`Retry-After`, and the outage is logged once, not once per request with a traceback. Nothing to reset: the pool
reconnects by itself, and the next request that reaches the database is answered as usual."""

from __future__ import annotations

import logging
import threading
import time

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse

from invokeai.app.services.database_retry import DATABASE_ERRORS

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5
UNAVAILABLE_DETAIL = "the database cannot be reached; try again shortly"
# Database errors closer together than this belong to one outage (one log line); after a quiet spell, a new one.
OUTAGE_QUIET_S = 60.0


class OutageLog:
    """Logs the first database error of an outage, and counts the requests answered 503 since."""

    def __init__(self, quiet_s: float = OUTAGE_QUIET_S) -> None:
        self._quiet_s = quiet_s
        self._lock = threading.Lock()
        self._last: float | None = None
        self.refused = 0

    def failed(self, request: Request, error: Exception) -> None:
        now = time.monotonic()
        with self._lock:
            starts = self._last is None or now - self._last > self._quiet_s
            self._last = now
            self.refused = 1 if starts else self.refused + 1
        if starts:
            reason = " ".join(str(error).split())
            logger.warning(
                "The database cannot be reached (%s: %s); API requests that need it are answered 503 until it "
                "answers (first: %s %s)",
                type(error).__name__,
                reason,
                request.method,
                request.url.path,
            )


async def database_unavailable(request: Request, error: Exception) -> JSONResponse:
    outages: OutageLog = request.app.state.outages
    outages.failed(request, error)
    return JSONResponse(
        {"detail": UNAVAILABLE_DETAIL},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def install_outage_handler(app: FastAPI) -> None:
    app.state.outages = OutageLog()
    for error in DATABASE_ERRORS:
        app.add_exception_handler(error, database_unavailable)
