"""What the multi-process tests run in each child process (spawned, so importable by name): a server's view of one
PostgreSQL database."""

from __future__ import annotations

import time

from invokeai.app.services.events import EventBus
from invokeai.app.services.postgres import PostgresDatabase
from invokeai.app.services.session_queue import SessionQueue


def open_database(url: str, start_at: float) -> int:
    """Wait until `start_at` (so that every process opens at once), open (and so migrate) the database and
    return its schema version."""
    time.sleep(max(0.0, start_at - time.time()))
    db = PostgresDatabase(url, pool_size=2)
    try:
        return db.schema_version
    finally:
        db.close()


def claim_until_empty(url: str, server: str, start_at: float) -> list[int]:
    """Claim and complete items as one server (one worker) until the queue is empty; the ids this one claimed."""
    db = PostgresDatabase(url, pool_size=2)
    queue = SessionQueue(db, EventBus(), 10_000, server=server)
    claimed: list[int] = []
    time.sleep(max(0.0, start_at - time.time()))
    try:
        while (item := queue.dequeue()) is not None:
            claimed.append(item.item_id)
            queue.complete(item.item_id, {})
        return claimed
    finally:
        db.close()
