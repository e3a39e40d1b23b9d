"""Process-wide logging: one format for InvokeAI's and uvicorn's messages."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    # force=True replaces any handler a library installed on import. uvicorn is started with log_config=None,
    # so its loggers (uvicorn.error, uvicorn.access) have no handlers of their own and propagate to this one.
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)
