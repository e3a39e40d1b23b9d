"""Running the ASGI app with uvicorn, and leaving quietly (exit 0, no traceback) on SIGINT or SIGTERM."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

_SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _do_nothing(signum: int, frame: FrameType | None) -> None:
    pass


def exit_quietly_on_signals() -> None:
    """Until the server runs, SIGINT and SIGTERM end the process with exit code 0 (no KeyboardInterrupt)."""
    for sig in _SHUTDOWN_SIGNALS:
        signal.signal(sig, _exit_now)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._on_exit is not None:
            # On a thread of its own: a signal handler must not take locks that the code it interrupted may hold.
            threading.Thread(target=self._on_exit, name="on-exit", daemon=True).start()
        super().handle_exit(sig, frame)


def serve(app: FastAPI, host: str, port: int, on_exit: Callable[[], None] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then return after uvicorn's graceful shutdown.

    on_exit runs when the signal arrives, before uvicorn waits for open responses to finish: it must end the
    responses that never finish on their own (event streams), or the shutdown would wait for the clients.
    """
    # uvicorn catches both signals, shuts down, puts back the handlers it found and raises the signal again so
    # that their action runs. The handlers it finds do nothing, so after a shutdown by signal this function
    # returns and the caller's code after it runs, instead of the process dying by SIGTERM, printing a
    # KeyboardInterrupt traceback, or unwinding through asyncio by _exit_now's SystemExit.
    for sig in _SHUTDOWN_SIGNALS:
        signal.signal(sig, _do_nothing)
    _Server(uvicorn.Config(app, host=host, port=port, log_config=None), on_exit).run()
