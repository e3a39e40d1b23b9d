"""What a worker does when the database does not answer: which errors mean that, a bounded retry with backoff for
the statements a running item cannot do without (its cancel check, recording its end), and the error that stops
the item when they still fail, so that a database outage is never recorded as the node's own error."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from invokeai.app.nodes.context import CanceledError

T = TypeVar("T")

# The database did not answer, or dropped the connection (a restart: "AdminShutdown: terminating connection"; the
# pool found no live connection in time: PoolTimeout is one of these). Not a constraint or a syntax error: those
# are the statement's own, and retrying them changes nothing.
DATABASE_ERRORS: tuple[type[Exception], ...] = (sqlite3.OperationalError, psycopg.OperationalError)

# The first retry waits this long, each next one twice as long, up to the cap.
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 1.0


class DatabaseLostError(CanceledError):
    """The database could not be reached for longer than a worker may wait: the running item stops (as for a cancel,
    so a node stops at its next check) and ends with DATABASE_UNREACHABLE_REASON, never as a node's failure."""


def caused_by_database(error: BaseException) -> bool:
    """Whether the database's absence is behind `error` (itself, or anything in its chain of causes)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, (DatabaseLostError, *DATABASE_ERRORS)):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def with_retries(call: Callable[[], T], budget_s: float, what: str) -> T:
    """call(), again after each database error with a growing wait, for up to `budget_s` seconds in all; then
    DatabaseLostError naming `what` and the last error."""
    deadline = time.monotonic() + budget_s
    delay = FIRST_DELAY_S
    while True:
        try:
            return call()
        except DATABASE_ERRORS as error:
            left = deadline - time.monotonic()
            if left <= 0:
                reason = " ".join(str(error).split())
                raise DatabaseLostError(
                    f"the database could not be reached for {budget_s:g} s ({what}): {type(error).__name__}: {reason}"
                ) from error
            time.sleep(min(delay, left))
            delay = min(delay * 2, MAX_DELAY_S)
