"""The session queue: queue items in SQLite, from enqueue through pending -> in_progress -> a finished status.

Every status change goes through this class, which publishes queue_item_status_changed after it commits.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

from invokeai.app.services.batch import expand_batch, item_count
from invokeai.app.services.events import BatchEnqueuedEvent, EventBus, QueueItemStatusChangedEvent
from invokeai.app.services.queue_models import (
    FINISHED_STATUSES,
    QUEUE_ITEM_STATUSES,
    Batch,
    EnqueueBatchResult,
    QueueCounts,
    QueueItemStatus,
    SessionQueueItem,
    SessionState,
    new_id,
)
from invokeai.app.services.sqlite import SqliteDatabase
from invokeai.app.services.timestamps import now_iso

logger = logging.getLogger(__name__)

RESTART_REASON = "the server stopped while this item was running"
SHUTDOWN_REASON = "the server was shutting down"
CANCEL_REASON = "canceled by request"


class QueueFullError(Exception):
    """Enqueuing the batch would take the pending items over max_queue_size; nothing was enqueued."""


class QueueItemNotFoundError(KeyError):
    pass


# The columns a queue_item_status_changed event repeats from the item, under the same names.
_STATUS_COLUMNS = tuple(name for name in QueueItemStatusChangedEvent.model_fields if name != "timestamp")


def _status_fields(row: sqlite3.Row) -> dict[str, Any]:
    return {name: row[name] for name in _STATUS_COLUMNS}


def _item(row: sqlite3.Row) -> SessionQueueItem:
    return SessionQueueItem(
        **_status_fields(row),
        priority=row["priority"],
        field_values=json.loads(row["field_values"]) if row["field_values"] else None,
        session=SessionState(
            id=row["session_id"],
            graph=json.loads(row["graph"]),
            results=json.loads(row["results"]) if row["results"] else {},
        ),
    )


def _status_event(row: sqlite3.Row) -> QueueItemStatusChangedEvent:
    return QueueItemStatusChangedEvent(**_status_fields(row))


class SessionQueue:
    def __init__(
        self, db: SqliteDatabase, events: EventBus, max_queue_size: int, max_graph_nodes: int | None = None
    ) -> None:
        self._db = db
        self._events = events
        self.max_queue_size = max_queue_size
        self.max_graph_nodes = max_graph_nodes  # None: no limit (the server passes its setting)

    def _publish_changes(self, rows: Sequence[sqlite3.Row]) -> None:
        for row in rows:
            self._events.publish(_status_event(row))

    def _pending_count(self, cursor: sqlite3.Cursor) -> int:
        return int(cursor.execute("SELECT COUNT(*) FROM session_queue WHERE status = 'pending'").fetchone()[0])

    def _check_room(self, pending: int, requested: int) -> None:
        if pending + requested > self.max_queue_size:
            raise QueueFullError(
                f"the batch makes {requested} queue items and {pending} are pending; at most "
                f"{self.max_queue_size} may be pending (max_queue_size). Nothing was enqueued."
            )

    def enqueue_batch(self, queue_id: str, batch: Batch, prepend: bool = False) -> EnqueueBatchResult:
        """Validate every graph of the batch, then insert all its items in one transaction, or none.

        Raises InvalidBatchError (a bad graph or datum) or QueueFullError.
        """
        requested = item_count(batch)
        # Checked before expanding (which validates each graph and may be slow) and again under the lock.
        self._check_room(self.counts_by_status()["pending"], requested)
        sessions = expand_batch(batch, self.max_graph_nodes)
        now = now_iso()
        with self._db.transaction() as cursor:
            self._check_room(self._pending_count(cursor), requested)
            priority = 0
            if prepend:
                top = cursor.execute("SELECT MAX(priority) FROM session_queue WHERE status = 'pending'").fetchone()[0]
                priority = max(top or 0, 0) + 1
            item_ids = []
            for _ in range(batch.runs):
                for session in sessions:
                    field_values = [value.model_dump(mode="json") for value in session.field_values]
                    cursor.execute(
                        "INSERT INTO session_queue (queue_id, batch_id, session_id, priority, field_values, graph, "
                        "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            queue_id,
                            batch.batch_id,
                            new_id(),
                            priority,
                            json.dumps(field_values) if field_values else None,
                            session.graph.model_dump_json(),
                            now,
                            now,
                        ),
                    )
                    item_ids.append(int(cursor.lastrowid or 0))
        result = EnqueueBatchResult(
            queue_id=queue_id,
            enqueued=len(item_ids),
            requested=requested,
            batch=batch,
            priority=priority,
            item_ids=item_ids,
        )
        self._events.publish(
            BatchEnqueuedEvent(
                queue_id=queue_id,
                batch_id=batch.batch_id,
                enqueued=result.enqueued,
                requested=requested,
                priority=priority,
            )
        )
        return result

    def dequeue(self) -> SessionQueueItem | None:
        """Mark the next pending item (highest priority, then oldest) in_progress and return it."""
        now = now_iso()
        with self._db.transaction() as cursor:
            rows = cursor.execute(
                "UPDATE session_queue SET status = 'in_progress', started_at = ?, updated_at = ? WHERE item_id = "
                "(SELECT item_id FROM session_queue WHERE status = 'pending' ORDER BY priority DESC, item_id LIMIT 1) "
                "RETURNING *",
                (now, now),
            ).fetchall()
        self._publish_changes(rows)
        return _item(rows[0]) if rows else None

    def _finish(self, item_id: int, status: QueueItemStatus, **columns: Any) -> bool:
        """Move a running item to a finished status; False if it was no longer running (canceled meanwhile)."""
        now = now_iso()
        assignments = ", ".join(f"{name} = ?" for name in columns)
        with self._db.transaction() as cursor:
            rows = cursor.execute(
                f"UPDATE session_queue SET status = ?, {assignments}, completed_at = ?, updated_at = ? "
                "WHERE item_id = ? AND status = 'in_progress' RETURNING *",
                (status, *columns.values(), now, now, item_id),
            ).fetchall()
        self._publish_changes(rows)
        return bool(rows)

    def complete(self, item_id: int, results: dict[str, dict[str, Any]]) -> bool:
        return self._finish(item_id, "completed", results=json.dumps(results))

    def fail(
        self, item_id: int, error_type: str, message: str, traceback: str, results: dict[str, dict[str, Any]]
    ) -> bool:
        return self._finish(
            item_id,
            "failed",
            error_type=error_type,
            error_message=message,
            error_traceback=traceback,
            results=json.dumps(results),
        )

    def _cancel_where(self, where: str, params: Sequence[Any], reason: str) -> list[sqlite3.Row]:
        now = now_iso()
        with self._db.transaction() as cursor:
            rows = cursor.execute(
                "UPDATE session_queue SET status = 'canceled', cancel_reason = ?, completed_at = ?, updated_at = ? "
                f"WHERE status IN ('pending', 'in_progress') AND ({where}) RETURNING *",
                (reason, now, now, *params),
            ).fetchall()
        self._publish_changes(rows)
        return rows

    def cancel_running(self, item_id: int, reason: str, results: dict[str, dict[str, Any]]) -> bool:
        """For the processor: the running item stopped because it was canceled (or the server is stopping)."""
        return self._finish(item_id, "canceled", cancel_reason=reason, results=json.dumps(results))

    def cancel(self, queue_id: str, item_id: int, reason: str = CANCEL_REASON) -> SessionQueueItem:
        """Cancel a pending or running item; a finished one is returned unchanged."""
        self._cancel_where("queue_id = ? AND item_id = ?", (queue_id, item_id), reason)
        return self.get(queue_id, item_id)

    def cancel_by_batch_ids(self, queue_id: str, batch_ids: Sequence[str], reason: str = CANCEL_REASON) -> int:
        if not batch_ids:
            return 0
        marks = ", ".join("?" for _ in batch_ids)
        return len(self._cancel_where(f"queue_id = ? AND batch_id IN ({marks})", (queue_id, *batch_ids), reason))

    def clear(self, queue_id: str) -> int:
        """Delete every item of the queue; a running one is canceled first so that the processor stops it."""
        self._cancel_where("queue_id = ? AND status = 'in_progress'", (queue_id,), "the queue was cleared")
        with self._db.transaction() as cursor:
            return cursor.execute("DELETE FROM session_queue WHERE queue_id = ?", (queue_id,)).rowcount

    def prune(self, queue_id: str) -> int:
        """Delete the queue's finished (completed, failed, canceled) items."""
        marks = ", ".join("?" for _ in FINISHED_STATUSES)
        with self._db.transaction() as cursor:
            return cursor.execute(
                f"DELETE FROM session_queue WHERE queue_id = ? AND status IN ({marks})", (queue_id, *FINISHED_STATUSES)
            ).rowcount

    def recover_interrupted(self) -> int:
        """At startup: an item still in_progress was running when the server died; it is canceled with a reason."""
        return len(self._cancel_where("status = 'in_progress'", (), RESTART_REASON))

    def is_running(self, item_id: int) -> bool:
        """False once the item was canceled or deleted: the processor's cancel check."""
        rows = self._db.execute("SELECT status FROM session_queue WHERE item_id = ?", (item_id,))
        return bool(rows) and rows[0]["status"] == "in_progress"

    def get(self, queue_id: str, item_id: int) -> SessionQueueItem:
        rows = self._db.execute("SELECT * FROM session_queue WHERE queue_id = ? AND item_id = ?", (queue_id, item_id))
        if not rows:
            raise QueueItemNotFoundError(f"queue {queue_id!r} has no item {item_id}")
        return _item(rows[0])

    def list_items(
        self, queue_id: str, status: QueueItemStatus | None, offset: int, limit: int
    ) -> tuple[list[SessionQueueItem], int]:
        """A page of the queue's items in the order they run (finished ones in the order they were made)."""
        where, params = (
            ("queue_id = ?", [queue_id]) if status is None else ("queue_id = ? AND status = ?", [queue_id, status])
        )
        with self._db.lock:
            total = self._db.execute(f"SELECT COUNT(*) AS n FROM session_queue WHERE {where}", params)[0]["n"]
            rows = self._db.execute(
                f"SELECT * FROM session_queue WHERE {where} ORDER BY item_id LIMIT ? OFFSET ?", (*params, limit, offset)
            )
        return [_item(row) for row in rows], int(total)

    def counts_by_status(self, queue_id: str | None = None) -> dict[QueueItemStatus, int]:
        where, params = ("", ()) if queue_id is None else ("WHERE queue_id = ?", (queue_id,))
        rows = self._db.execute(f"SELECT status, COUNT(*) AS n FROM session_queue {where} GROUP BY status", params)
        counts: dict[QueueItemStatus, int] = dict.fromkeys(QUEUE_ITEM_STATUSES, 0)
        counts.update({row["status"]: int(row["n"]) for row in rows})
        return counts

    def status(self, queue_id: str) -> QueueCounts:
        with self._db.lock:
            counts = self.counts_by_status(queue_id)
            running = self._db.execute(
                "SELECT item_id, batch_id, session_id FROM session_queue WHERE queue_id = ? AND status = 'in_progress'",
                (queue_id,),
            )
        current = running[0] if running else None
        return QueueCounts(
            queue_id=queue_id,
            item_id=current["item_id"] if current else None,
            batch_id=current["batch_id"] if current else None,
            session_id=current["session_id"] if current else None,
            total=sum(counts.values()),
            **counts,
        )
