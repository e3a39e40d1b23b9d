"""PostgreSQL advisory locks: what one server at a time may do among all the servers on one database (`database_url`),
such as installing the demo models on a first start. Held on a connection of their own, so that a server that dies
while holding one releases it with its connection."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

logger = logging.getLogger(__name__)


def lock_key(name: str) -> int:
    """The lock's 64-bit key: a hash of its name, so that each lock is named where it is taken."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


@contextmanager
def server_lock(database_url: str, name: str, waiting: str) -> Iterator[None]:
    """Held by one server at a time among those on `database_url`; a server that finds it taken logs `waiting`
    and waits. Without a database_url (SQLite: one server) there is nobody to wait for."""
    if not database_url:
        yield
        return
    key = lock_key(name)
    with psycopg.connect(database_url, autocommit=True, application_name=f"invokeai-lock-{name}"[:63]) as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if not (row and row[0]):
            logger.info("%s", waiting)
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            yield
        finally:
            if not conn.closed:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
