"""The session queue: queue items in the database (SQLite or PostgreSQL), from enqueue through pending ->
in_progress -> a finished status.

Every status change goes through this class, which publishes queue_item_status_changed after it commits. Several
servers may share one PostgreSQL queue: an item is claimed by one worker, carries a lease that its server renews,
and is recovered by any server once the lease runs out.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

from pydantic import TypeAdapter

from invokeai.app.nodes.context import CanceledError
from invokeai.app.nodes.graph import Graph, execution_order
from invokeai.app.services.batch import expand_batch, item_count
from invokeai.app.services.database import (
    Cursor,
    Database,
    Row,
    advisory_lock,
    database_now,
    database_time_in,
    for_share,
    skip_locked,
)
from invokeai.app.services.events import (
    BatchEnqueuedEvent,
    BatchStatusCounts,
    EventBase,
    EventBus,
    QueueClearedEvent,
    QueueItemsCanceledEvent,
    QueueItemsRetriedEvent,
    QueueItemStatusChangedEvent,
    QueuePrunedEvent,
    QueueStatusCounts,
)
from invokeai.app.services.images import MAX_IMAGE_BATCH, ImageService
from invokeai.app.services.queue_claims import (
    AFFINITY_MAX_WAIT_S,
    AFFINITY_WINDOW,
    Candidate,
    choose_item,
    models_column,
    read_models_column,
)
from invokeai.app.services.queue_models import (
    FINISHED_STATUSES,
    QUEUE_ITEM_STATUSES,
    Batch,
    BatchStatus,
    EnqueueBatchResult,
    GraphExecutionState,
    ItemIdsResult,
    NodeFieldValue,
    QueueCounts,
    QueueItemStatus,
    RetryItemsResult,
    SessionQueueCountsByDestination,
    SessionQueueItem,
    new_id,
)
from invokeai.app.services.timestamps import now_iso
from invokeai.app.services.transactional_events import FLUSH_WAIT_S, TransactionalEvents

logger = logging.getLogger(__name__)

RESTART_REASON = "the server stopped while this item was running"
LEASE_EXPIRED_REASON = "its server stopped while it was running"
DEFAULT_LEASE_SECONDS = 30
SHUTDOWN_REASON = "the server was shutting down"
CANCEL_REASON = "canceled by request"
DATABASE_UNREACHABLE_REASON = "the database was unreachable, so its run could not be recorded"


class NotOwnedError(CanceledError):
    """A write of a run that is no longer its claim's (canceled, recovered from a server cut off past its lease, or
    claimed again since): refused, and the run stops as for a cancel."""


# Called inside the transaction of a write a run makes (an image record): raises NotOwnedError unless the run still
# holds its item, and on PostgreSQL keeps the item's row from changing until that transaction ends.
Fence = Callable[[Cursor], None]


class QueueFullError(Exception):
    """Enqueuing the batch would take the pending items over max_queue_size; nothing was enqueued."""


class QueueItemNotFoundError(KeyError):
    pass


RETRYABLE_STATUSES = ("failed", "canceled")
# Any fixed 64-bit number: the lock every server takes before it counts the pending items and adds to them.
_ENQUEUE_LOCK = 0x496E766F6B6551


class RetryRefusedError(ValueError):
    """retry_items_by_id named an item that is not failed or canceled; nothing was enqueued."""


# list_all answers every matching item with its graph: past this many it is refused (item_ids with items_by_ids, or
# list with offset and limit, page through any number), so that one request cannot build a response of any size.
MAX_LIST_ALL = 10_000


class TooManyItemsError(ValueError):
    """list_all would answer more than MAX_LIST_ALL items."""


# The columns a queue_item_status_changed event repeats from the item, under the same names; the others are the
# event's own, or InvokeAI's that this server fills after the change (_publish_changes).
_STATUS_COLUMNS = tuple(
    name
    for name in QueueItemStatusChangedEvent.model_fields
    if name not in ("timestamp", "user_id", "status_sequence", "batch_status", "queue_status")
)
# The statuses InvokeAI's BatchStatus and SessionQueueStatus count (a status this server lacks counts 0).
_COUNTED = ("pending", "in_progress", "waiting", "completed", "failed", "canceled")
_COUNTS = (
    "SELECT 'queue' AS part, status, COUNT(*) AS n, CAST(NULL AS BIGINT) AS item_id, CAST(NULL AS TEXT) AS batch_id, "
    "CAST(NULL AS TEXT) AS session_id "
    "FROM session_queue WHERE queue_id = ? GROUP BY status "
    "UNION ALL SELECT 'batch', status, COUNT(*), CAST(NULL AS BIGINT), CAST(NULL AS TEXT), CAST(NULL AS TEXT) "
    # `queue_id || ''`: not indexable, so both databases read the batch's rows by its index, not the queue's.
    "FROM session_queue WHERE queue_id || '' = ? AND batch_id = ? GROUP BY status "
    "UNION ALL SELECT * FROM (SELECT 'current', status, 1, item_id, batch_id, session_id FROM session_queue "
    "WHERE queue_id = ? AND status = 'in_progress' ORDER BY item_id LIMIT 1) AS running"
)
# A pending item that may be claimed now: none is while the queue is paused (the flag every server reads).
_CLAIMABLE = "status = 'pending' AND NOT EXISTS (SELECT 1 FROM processor_state WHERE paused <> 0)"
_SELECT_ITEMS = "SELECT * FROM session_queue q"  # without the graph text: see SessionQueue._items
# A JSON escape of a UTF-16 surrogate: json.loads turns a lone one into a str that cannot be encoded as UTF-8.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_READ_ERROR_CHARS = 500
_NO_TIME = datetime(1970, 1, 1, tzinfo=UTC)
# For a damaged column that the item cannot do without (the schema's constraints make these all but impossible).
_STAND_INS: dict[str, Any] = {
    "queue_id": "",
    "batch_id": "",
    "session_id": "",
    "status": "failed",
    "priority": 0,
    "created_at": _NO_TIME,
    "updated_at": _NO_TIME,
}

# graph_id -> the stored graph's JSON, parsed, and the Graph itself: one read serves every item of a batch.
GraphCache = dict[int, tuple[dict[str, Any], Graph]]
# graph_id -> the stored graph's text (None: the row is missing).
GraphTexts = dict[int, str | None]


def _stored_time(text: object) -> datetime:
    try:
        value = datetime.fromisoformat(str(text))
    except ValueError:
        return _NO_TIME  # a damaged time: the item counts as long waiting, so it is never passed over
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _status_fields(row: Row) -> dict[str, Any]:
    return {name: row[name] for name in _STATUS_COLUMNS}


def _loads(text: object) -> Any:
    if not isinstance(text, str):
        raise TypeError(f"a JSON column holds {type(text).__name__}, not text")
    value = json.loads(text)
    if _ESCAPED_SURROGATE.search(text):
        # Raises UnicodeEncodeError (a ValueError) for a lone surrogate, which no response could carry.
        json.dumps(value, ensure_ascii=False).encode()
    return value


def _graph(row: Row, field_values: list[NodeFieldValue], texts: GraphTexts, graphs: GraphCache) -> Graph:
    """The batch's graph with this item's batch data put in (validated when the batch was enqueued)."""
    graph_id = row["graph_id"]
    if graph_id not in graphs:
        text = texts.get(graph_id)
        if text is None:
            raise ValueError(f"its graph (graph_id {graph_id}) is missing")
        data = _loads(text)
        graphs[graph_id] = (data, Graph.model_validate(data))
    data, graph = graphs[graph_id]
    if not field_values:
        return graph
    nodes = dict(data["nodes"])
    for value in field_values:
        if value.node_path not in nodes:
            raise ValueError(f"its batch data names node {value.node_path!r}, which its graph does not have")
        nodes[value.node_path] = {**nodes[value.node_path], value.field_name: value.value}
    return Graph.model_validate({**data, "nodes": nodes})


def _item(row: Row, texts: GraphTexts, graphs: GraphCache) -> SessionQueueItem:
    """The item as stored; a row that cannot be read back (damaged) is returned with read_error saying why."""
    try:
        field_values = (
            [NodeFieldValue.model_validate(value) for value in _loads(row["field_values"])]
            if row["field_values"]
            else []
        )
        return SessionQueueItem(
            **_status_fields(row),  # origin and destination among them
            priority=row["priority"],
            retried_from_item_id=row["retried_from_item_id"],
            field_values=field_values or None,
            session=_session(
                row, _graph(row, field_values, texts, graphs), _loads(row["results"]) if row["results"] else {}
            ),
        )
    except Exception as error:  # whatever is wrong with one stored row, the others stay readable
        logger.warning("Queue item %s cannot be read: %s: %s", row["item_id"], type(error).__name__, error)
        return _unreadable_item(row, error)


def _failed_node(graph: Graph, results: dict[str, Any]) -> str | None:
    """The node a failed item failed at: the processor runs the nodes in execution order and stops at the one that
    fails, so it is the first in that order without a result."""
    try:
        return next((node_id for node_id in execution_order(graph) if node_id not in results), None)
    except ValueError:  # a graph that no longer validates (it did when enqueued): no node to blame
        return None


def _session(row: Row, graph: Graph, results: dict[str, Any]) -> GraphExecutionState:
    """InvokeAI's GraphExecutionState of the item, from its graph and the results stored when it ended."""
    if not isinstance(results, dict):
        raise TypeError(f"its results are {type(results).__name__}, not an object")
    executed = [node_id for node_id in results if node_id in graph.nodes]
    errors: dict[str, str] = {}
    if row["status"] == "failed" and row["error_type"]:
        failed = _failed_node(graph, results)
        if failed is not None:
            errors[failed] = f"{row['error_type']}: {row['error_message']}"
    prepared = [*executed, *errors]
    nodes = {node_id: graph.nodes[node_id] for node_id in prepared}
    # Built from the graph's own validated nodes and edges: nothing to validate again.
    execution_graph = Graph.model_construct(
        id=graph.id,
        nodes=nodes,
        edges=[e for e in graph.edges if e.source.node_id in nodes and e.destination.node_id in nodes],
    )
    return GraphExecutionState(
        id=row["session_id"],
        graph=graph,
        execution_graph=execution_graph,
        executed=executed,
        executed_history=executed,
        results=results,
        errors=errors,
        prepared_source_mapping={node_id: node_id for node_id in prepared},
        source_prepared_mapping={node_id: [node_id] for node_id in prepared},
        workflow_call_stack=[],
        workflow_call_history=[],
    )


@cache
def _adapter(name: str) -> TypeAdapter[Any]:
    return TypeAdapter(SessionQueueItem.model_fields[name].annotation)


def _unreadable_item(row: Row, error: Exception) -> SessionQueueItem:
    """Every column that still reads as its type, without the session; read_error says what is wrong."""
    reason = f"the stored item cannot be read: {type(error).__name__}: {error}"
    if len(reason) > _READ_ERROR_CHARS:
        reason = reason[: _READ_ERROR_CHARS - 3] + "..."
    fields: dict[str, Any] = {}
    for name in (*_STATUS_COLUMNS, "priority", "origin", "destination", "retried_from_item_id"):
        try:
            fields[name] = _adapter(name).validate_python(row[name])
        except Exception:  # a damaged column is left out, as far as its type allows
            fields[name] = _STAND_INS.get(name)
    return SessionQueueItem(
        **fields,
        field_values=None,
        session=None,
        read_error=reason.encode("utf-8", "replace").decode("utf-8"),
    )


def _status_event(row: Row, counts: dict[str, Any]) -> QueueItemStatusChangedEvent:
    try:
        return QueueItemStatusChangedEvent(**_status_fields(row), **counts)
    except ValueError as error:  # a damaged row: the event says what still reads
        item = _unreadable_item(row, error)
        return QueueItemStatusChangedEvent(**{name: getattr(item, name) for name in _STATUS_COLUMNS}, **counts)


def _mark_incomplete_runs(cursor: Cursor, rows: Sequence[Row]) -> None:
    """In a status change's transaction, after its UPDATE: the images written by the runs of the items it ended
    without completing them (failed, canceled, or put back as pending) are marked of_incomplete_run.

    Every image a run records is fenced: its transaction holds the item's row (FOR SHARE on PostgreSQL; SQLite's
    writers take turns) while it checks that the item is still in_progress under its claim. The UPDATE before this
    one waited for those transactions to commit, and every later one is refused, so this statement (which sees what
    has committed by now, READ COMMITTED) finds every image the run will ever have."""
    ended = [
        int(row["item_id"])
        for row in rows
        # Those that ran: a pending item canceled never wrote anything.
        if row["status"] == "pending" or (row["status"] in ("failed", "canceled") and row["started_at"] is not None)
    ]
    for start in range(0, len(ended), 500):  # SQLite's limit on bound parameters
        chunk = ended[start : start + 500]
        cursor.execute(
            f"UPDATE images SET of_incomplete_run = TRUE WHERE queue_item_id IN ({', '.join('?' for _ in chunk)}) "
            "AND of_incomplete_run = FALSE",
            chunk,
        )


def this_server() -> str:
    """`<host>:<pid>`: what a claimed item's `worker` starts with, so that a server finds the items it runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


class SessionQueue:
    def __init__(
        self,
        db: Database,
        events: EventBus,
        max_queue_size: int,
        max_graph_nodes: int | None = None,
        *,
        affinity_max_wait_s: float = AFFINITY_MAX_WAIT_S,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        requeue_interrupted: bool = False,
        server: str | None = None,
        images: ImageService | None = None,
    ) -> None:
        """images: where prune removes the images of runs that did not complete (None: it leaves them)."""
        self._db = db
        self._images = images
        self._events = events
        self.max_queue_size = max_queue_size
        self.max_graph_nodes = max_graph_nodes  # None: no limit (the server passes its setting)
        self.affinity_max_wait_s = affinity_max_wait_s
        self.lease_seconds = lease_seconds
        self.requeue_interrupted = requeue_interrupted
        self.server = server or this_server()
        # With other servers on the database: the event relay, which sends a status change's events in its own
        # transaction (set by the container once the relay exists; None alone, on SQLite).
        self.transactional_events: TransactionalEvents | None = None
        # item_id -> the token of this server's claim, for the items it runs now: added once a claim commits,
        # removed when the item is finished here or its worker lets it go (release). Only these leases are renewed,
        # so an item a worker dropped runs out of lease and is recovered by a sweep. A server cut off from the
        # database for longer than the lease may find its item recovered and claimed by another: it must then
        # neither finish that run nor go on with its own (see _finish and is_running).
        self._claims: dict[int, str] = {}
        # Held from a claim's transaction until its claim is recorded above, and by end_dropped: an item claimed a
        # moment ago is never taken for one that no worker runs.
        self._claim_lock = threading.Lock()

    def _items(self, rows: Sequence[Row]) -> list[SessionQueueItem]:
        """The items of these rows, each batch's graph read and parsed once (not once per row: it may be large)."""
        graph_ids = list({row["graph_id"] for row in rows})
        texts: GraphTexts = {}
        for start in range(0, len(graph_ids), 500):  # SQLite's limit on bound parameters
            chunk = graph_ids[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            found = self._db.execute(
                f"SELECT graph_id, graph FROM session_queue_graphs WHERE graph_id IN ({marks})", chunk
            )
            texts.update({row["graph_id"]: row["graph"] for row in found})
        graphs: GraphCache = {}
        return [_item(row, texts, graphs) for row in rows]

    def _publish_changes(self, rows: Sequence[Row]) -> None:
        for event in self._status_events(rows):
            self._events.publish(event)

    def _status_events(self, rows: Sequence[Row]) -> list[EventBase]:
        # InvokeAI's event carries the batch's and the queue's counts after the change: one read per batch (a bulk
        # change of many items of one batch costs one read, not one per item), and none where nobody takes the
        # event (a client subscribing later re-reads the queue, as after any reconnect).
        counts: dict[tuple[str, str], dict[str, Any]] = {}
        events: list[EventBase] = []
        for row in rows:
            key = (str(row["queue_id"]), str(row["batch_id"]))
            if key not in counts:
                if not self._events.is_wanted(QueueItemStatusChangedEvent.event_name, key[0]):
                    continue
                counts[key] = self._counts_after_change(*key, row["origin"], row["destination"])
            events.append(_status_event(row, counts[key]))
        return events

    def _announced(
        self, change: Callable[[Cursor], list[Row]], announce: Callable[[list[Row]], list[EventBase]]
    ) -> list[Row]:
        """Run a status change (`change`, in one transaction) and publish the events `announce` makes of its rows.

        With other servers on the database (a relay), the events are sent in the change's own transaction: they
        reach the other servers exactly when the change commits, even if this server is killed a moment later, and
        never for a change that rolled back. The events published before (the node's own) go out first, so an
        item's events keep their order. Alone (SQLite), they are made in the change's transaction and published once
        it has committed."""
        relay = self.transactional_events
        if relay is None:
            with self._db.transaction() as cursor:
                rows = change(cursor)
                _mark_incomplete_runs(cursor, rows)
                # Made in the change's transaction (the counts after it): a database lost just after the commit
                # cannot leave a change recorded whose events were never made.
                events = announce(rows)
            for event in events:
                self._events.publish(event)
            return rows
        relay.flush(FLUSH_WAIT_S)
        with self._db.transaction() as cursor:
            rows = change(cursor)
            _mark_incomplete_runs(cursor, rows)
            events = announce(rows)  # the counts after the change, read in its transaction
            if events:
                relay.notify_in(cursor, events)
        for event in events:
            relay.publish_sent(event)
        return rows

    def _counts_after_change(
        self, queue_id: str, batch_id: str, origin: str | None, destination: str | None
    ) -> dict[str, Any]:
        """batch_status and queue_status of a queue_item_status_changed event, in one statement (one round trip
        and one snapshot on PostgreSQL): the queue's items per status, its batch's, and the item running now."""
        rows = self._db.execute(_COUNTS, (queue_id, queue_id, batch_id, queue_id))
        in_queue = {str(row["status"]): int(row["n"]) for row in rows if row["part"] == "queue"}
        in_batch = {str(row["status"]): int(row["n"]) for row in rows if row["part"] == "batch"}
        current = next((row for row in rows if row["part"] == "current"), None)
        return {
            "batch_status": BatchStatusCounts(
                queue_id=queue_id,
                batch_id=batch_id,
                origin=origin,
                destination=destination,
                total=sum(in_batch.values()),
                **{status: in_batch.get(status, 0) for status in _COUNTED},
            ),
            "queue_status": QueueStatusCounts(
                queue_id=queue_id,
                item_id=current["item_id"] if current else None,
                batch_id=current["batch_id"] if current else None,
                session_id=current["session_id"] if current else None,
                total=sum(in_queue.values()),
                **{status: in_queue.get(status, 0) for status in _COUNTED},
            ),
        }

    def _lock_enqueues(self, cursor: Cursor) -> None:
        """Before the count that max_queue_size is checked against: held to the end of the transaction, so no other
        enqueue (of this server or another) counts before this one's items are in. Without it, concurrent bursts
        each counted the others' items as absent and went past the limit by a third."""
        statement = advisory_lock(self._db.dialect)
        if statement is not None:
            cursor.execute(statement, (_ENQUEUE_LOCK,))

    def _pending_count(self, cursor: Cursor) -> int:
        return int(cursor.execute("SELECT COUNT(*) FROM session_queue WHERE status = 'pending'").fetchone()[0])

    def _check_room(self, pending: int, requested: int) -> None:
        if pending + requested > self.max_queue_size:
            raise QueueFullError(
                f"the batch makes {requested} queue items and {pending} are pending; at most "
                f"{self.max_queue_size} may be pending (max_queue_size). Nothing was enqueued."
            )

    def enqueue_batch(self, queue_id: str, batch: Batch, prepend: bool = False) -> EnqueueBatchResult:
        """Validate every graph of the batch, then insert all its items in one transaction, or none.

        The graph is stored once for the whole batch, each item with only its batch data (field_values).
        Raises InvalidBatchError (a bad graph or datum) or QueueFullError.
        """
        requested = item_count(batch)
        # Checked before expanding (which validates each graph and may be slow) and again under the lock.
        self._check_room(self.counts_by_status()["pending"], requested)
        sessions = expand_batch(batch, self.max_graph_nodes)
        now = now_iso()
        values = [
            (
                json.dumps([value.model_dump(mode="json") for value in session.field_values])
                if session.field_values
                else None,
                models_column(session.graph),
            )
            for session in sessions
        ]
        with self._db.transaction() as cursor:
            self._lock_enqueues(cursor)
            self._check_room(self._pending_count(cursor), requested)
            priority = 0
            if prepend:
                top = cursor.execute("SELECT MAX(priority) FROM session_queue WHERE status = 'pending'").fetchone()[0]
                priority = max(top or 0, 0) + 1
            graph_id = cursor.execute(
                "INSERT INTO session_queue_graphs (graph, workflow) VALUES (?, ?) RETURNING graph_id",
                (batch.graph.model_dump_json(), json.dumps(batch.workflow) if batch.workflow is not None else None),
            ).fetchone()[0]
            cursor.executemany(
                "INSERT INTO session_queue (queue_id, batch_id, session_id, priority, origin, destination, graph_id, "
                "field_values, models, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        queue_id,
                        batch.batch_id,
                        new_id(),
                        priority,
                        batch.origin,
                        batch.destination,
                        graph_id,
                        field_values,
                        models,
                        now,
                        now,
                    )
                    for _ in range(batch.runs)
                    for field_values, models in values
                ],
            )
            # The graph row is this request's own: its items are exactly the ones just inserted, in order.
            item_ids = [
                int(row[0])
                for row in cursor.execute(
                    "SELECT item_id FROM session_queue WHERE graph_id = ? ORDER BY item_id", (graph_id,)
                ).fetchall()
            ]
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
                origin=batch.origin,
            )
        )
        return result

    def retry_items_by_id(self, queue_id: str, item_ids: Sequence[int]) -> RetryItemsResult:
        """Enqueue each failed or canceled item again as a new pending item (same graph, data and priority) that
        links to it; all or none.

        Raises QueueItemNotFoundError for an id not in the queue, RetryRefusedError for an item that is not failed
        or canceled, QueueFullError when the new items do not fit.
        """
        wanted = list(dict.fromkeys(item_ids))
        if not wanted:  # InvokeAI answers an empty list with an empty result
            return RetryItemsResult(queue_id=queue_id, retried_item_ids=[], item_ids=[])
        marks = ", ".join("?" for _ in wanted)
        now = now_iso()
        with self._db.transaction() as cursor:
            rows = {
                row["item_id"]: row
                for row in cursor.execute(
                    f"SELECT item_id, status FROM session_queue WHERE queue_id = ? AND item_id IN ({marks})",
                    (queue_id, *wanted),
                ).fetchall()
            }
            missing = [item_id for item_id in wanted if item_id not in rows]
            if missing:
                raise QueueItemNotFoundError(f"queue {queue_id!r} has no item {', '.join(map(str, missing))}")
            unfinished = [f"{i} ({rows[i]['status']})" for i in wanted if rows[i]["status"] not in RETRYABLE_STATUSES]
            if unfinished:
                raise RetryRefusedError(
                    "only failed or canceled items can be retried; these are not: " + ", ".join(unfinished)
                )
            self._lock_enqueues(cursor)
            self._check_room(self._pending_count(cursor), len(wanted))
            new_ids = []
            for item_id in wanted:
                row = cursor.execute(
                    "INSERT INTO session_queue (queue_id, batch_id, session_id, priority, origin, destination, "
                    "graph_id, field_values, models, retried_from_item_id, created_at, updated_at) "
                    "SELECT queue_id, batch_id, ?, priority, origin, destination, graph_id, field_values, models, "
                    "item_id, ?, ? FROM session_queue WHERE item_id = ? RETURNING item_id",
                    (new_id(), now, now, item_id),
                ).fetchone()
                new_ids.append(int(row[0]))
        result = RetryItemsResult(queue_id=queue_id, retried_item_ids=wanted, item_ids=new_ids)
        self._events.publish(QueueItemsRetriedEvent(queue_id=queue_id, retried_item_ids=wanted, item_ids=new_ids))
        return result

    def workflow_of(self, item_id: int) -> str | None:
        """The workflow sent with the item's batch (JSON text), or None."""
        rows = self._db.execute(
            "SELECT g.workflow FROM session_queue q JOIN session_queue_graphs g ON g.graph_id = q.graph_id "
            "WHERE q.item_id = ?",
            (item_id,),
        )
        return rows[0]["workflow"] if rows else None

    def dequeue(
        self, worker: str = "session-processor", on_device: frozenset[str] = frozenset()
    ) -> SessionQueueItem | None:
        """Claim the next pending item for `worker` of this server: in_progress, with a lease, and `<host>:<pid>/
        <worker>` in the item's `worker`. The next item is the highest priority's oldest, unless a later one of that
        priority uses only models in `on_device` (model tokens) and the oldest has waited less than
        affinity_max_wait_s. None when there is none, or while the queue is paused (on any server sharing it).

        An item that cannot be read back comes with read_error set and no session: the caller fails it."""
        with self._claim_lock:
            with self._db.transaction() as cursor:
                chosen = self._affine_item(cursor, on_device) if on_device else None
                rows = self.claim(cursor, chosen, worker) if chosen is not None else []
                if not rows:  # no preference, or the preferred item was taken meanwhile (another server): the next
                    candidates = self.lock_pending(cursor, limit=1)
                    rows = self.claim(cursor, candidates[0]["item_id"], worker) if candidates else []
            # Only now, after the commit: a claim whose commit failed is not this server's to renew (if it did
            # commit unseen, end_dropped ends it).
            for row in rows:
                self._claims[int(row["item_id"])] = str(row["claim_token"])
        try:
            self._publish_changes(rows)
            return self._items(rows)[0] if rows else None
        except BaseException:
            # The claim committed, but its item could not be read back (the database went away in between): no
            # worker runs it, so its lease must not be renewed; end_dropped ends it once the database answers.
            for row in rows:
                self.release(int(row["item_id"]))
            raise

    def _affine_item(self, cursor: Cursor, on_device: frozenset[str]) -> int | None:
        """The item to prefer among the next pending ones of the highest priority (read, not locked: the claim
        checks that it is still pending)."""
        rows = cursor.execute(
            f"SELECT item_id, models, created_at FROM session_queue WHERE {_CLAIMABLE} AND priority = "
            "(SELECT MAX(priority) FROM session_queue WHERE status = 'pending') ORDER BY item_id LIMIT ?",
            (AFFINITY_WINDOW,),
        ).fetchall()
        candidates = [
            Candidate(row["item_id"], read_models_column(row["models"]), _stored_time(row["created_at"]))
            for row in rows
        ]
        return choose_item(candidates, on_device, datetime.now(UTC), self.affinity_max_wait_s)

    def lock_pending(self, cursor: Cursor, limit: int) -> list[Row]:
        """In a claiming transaction: the next `limit` pending items in run order, none while the queue is paused.

        On PostgreSQL they stay locked until the transaction ends, and items that other servers are claiming are
        skipped rather than waited for: whatever the number of servers, no two claim the same item. SQLite's
        transaction (BEGIN IMMEDIATE) already excludes every other writer."""
        return cursor.execute(
            f"SELECT item_id FROM session_queue WHERE {_CLAIMABLE} "
            f"ORDER BY priority DESC, item_id LIMIT ? {skip_locked(self._db.dialect)}",
            (limit,),
        ).fetchall()

    def claim(self, cursor: Cursor, item_id: int, worker: str) -> list[Row]:
        """In the transaction that locked it (lock_pending): the item in_progress for `worker` of this server
        (`<host>:<pid>/<worker>`), with a lease. Its row, to publish and return once the transaction commits."""
        now, holder = now_iso(), f"{self.server}/{worker}"
        return cursor.execute(
            "UPDATE session_queue SET status = 'in_progress', started_at = ?, updated_at = ?, worker = ?, "
            f"claim_token = ?, lease_expires_at = {database_time_in(self._db.dialect)} "
            "WHERE item_id = ? AND status = 'pending' RETURNING *",
            (now, now, holder, uuid.uuid4().hex, self.lease_seconds, item_id),
        ).fetchall()

    def running_here(self) -> dict[int, str]:
        """The items this server's workers run now (item_id -> its claim's token), as this server knows it."""
        return dict(self._claims)  # a copy: workers claim and release meanwhile

    def release(self, item_id: int) -> None:
        """The worker is done with the item, however it ended (also when it could not record the end): its lease is
        no longer renewed, so an item left in_progress runs out of lease and is recovered."""
        self._claims.pop(item_id, None)

    def renew_leases(self, item_ids: Sequence[int] | None = None) -> int:
        """Extend the leases of the items this server runs now (all of them, or those among `item_ids`), each only
        while it is still in_progress under the claim made here (its token); one statement. Never the other
        in_progress rows of this server's `host:pid`: one its worker dropped must run out of lease. Returns how many
        were renewed."""
        claims = self.running_here()
        wanted = claims if item_ids is None else item_ids
        mine = [(item_id, claims[item_id]) for item_id in wanted if item_id in claims]
        if not mine:
            return 0
        which = " OR ".join("(item_id = ? AND claim_token = ?)" for _ in mine)
        with self._db.transaction() as cursor:
            return cursor.execute(
                f"UPDATE session_queue SET lease_expires_at = {database_time_in(self._db.dialect)} "
                f"WHERE status = 'in_progress' AND ({which})",
                (self.lease_seconds, *(value for pair in mine for value in pair)),
            ).rowcount

    def end_dropped(self) -> int:
        """The lease keeper's, before it renews: end every in_progress item of this server (`host:pid`) that none of
        its workers runs now. A worker lets an item go that way only when the database could not be reached to record
        its end, or a claim committed while its answer was lost: it ends with DATABASE_UNREACHABLE_REASON (or is put
        back as pending, with requeue_interrupted) as soon as the database answers, not a lease later as if its
        server had stopped. Returns how many."""
        prefix = f"{self.server}/"
        with self._claim_lock:
            running = list(self._claims)
            where, params = "substr(worker, 1, ?) = ?", [len(prefix), prefix]
            if running:
                where += f" AND item_id NOT IN ({', '.join('?' for _ in running)})"
                params.extend(running)
            return self._recover(where, params, DATABASE_UNREACHABLE_REASON)

    def recover_expired(self) -> int:
        """Every server's sweep: an item whose lease ran out was running on a server that stopped. It is canceled
        with LEASE_EXPIRED_REASON, or put back as pending (requeue_interrupted); finished items are never touched.
        Leases are written and compared in the database's clock, never this host's."""
        return self._recover(f"lease_expires_at < {database_now(self._db.dialect)}", (), LEASE_EXPIRED_REASON)

    def _recover(self, where: str, params: Sequence[Any], reason: str) -> int:
        # Looked for first (a read on the status index): the sweep and end_dropped run every lease keeper round and
        # nearly always find nothing, and a change would first flush the relay's events (end_dropped holds the
        # claim lock meanwhile).
        found = self._db.execute(
            f"SELECT 1 FROM session_queue WHERE status = 'in_progress' AND ({where}) LIMIT 1", params
        )
        if not found:
            return 0
        now = now_iso()
        if self.requeue_interrupted:
            change = (
                "status = 'pending', worker = NULL, claim_token = NULL, lease_expires_at = NULL, started_at = NULL, "
                "updated_at = ?",
                (now,),
            )
        else:
            change = (
                "status = 'canceled', cancel_reason = ?, completed_at = ?, updated_at = ?, lease_expires_at = NULL",
                (reason, now, now),
            )
        statement = f"UPDATE session_queue SET {change[0]} WHERE status = 'in_progress' AND ({where}) RETURNING *"
        rows = self._announced(
            lambda cursor: cursor.execute(statement, (*change[1], *params)).fetchall(), self._status_events
        )
        return len(rows)

    def _finish(self, item_id: int, status: QueueItemStatus, **columns: Any) -> bool:
        """Move a running item to a finished status; False if it was no longer running (canceled meanwhile, or
        recovered from this server and claimed again elsewhere)."""
        now = now_iso()
        assignments = ", ".join(f"{name} = ?" for name in columns)
        token = self._claims.get(item_id)
        mine, params = ("", ()) if token is None else (" AND claim_token = ?", (token,))
        statement = (
            f"UPDATE session_queue SET status = ?, {assignments}, completed_at = ?, updated_at = ? "
            f"WHERE item_id = ? AND status = 'in_progress'{mine} RETURNING *"
        )
        values = (status, *columns.values(), now, now, item_id, *params)
        rows = self._announced(lambda cursor: cursor.execute(statement, values).fetchall(), self._status_events)
        # Kept until the change is recorded: while a finish is retried (the database away) the lease is renewed.
        self.release(item_id)
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

    def _cancel_where(
        self, where: str, params: Sequence[Any], reason: str, announce: Callable[[list[Row]], list[EventBase]]
    ) -> list[Row]:
        now = now_iso()
        statement = (
            "UPDATE session_queue SET status = 'canceled', cancel_reason = ?, completed_at = ?, updated_at = ? "
            f"WHERE status IN ('pending', 'in_progress') AND ({where}) RETURNING *"
        )
        return self._announced(
            lambda cursor: cursor.execute(statement, (reason, now, now, *params)).fetchall(), announce
        )

    def _cancel_many(self, where: str, params: Sequence[Any], reason: str) -> int:
        """Cancel every pending or running item that matches, announced by one queue_items_canceled per queue:
        one event per item would make a bulk cancel look, to every reader of the stream, like falling behind."""

        def announce(rows: list[Row]) -> list[EventBase]:
            by_queue: dict[str, list[Row]] = {}
            for row in rows:
                by_queue.setdefault(row["queue_id"], []).append(row)
            return [
                QueueItemsCanceledEvent(
                    queue_id=queue_id,
                    item_ids=[row["item_id"] for row in canceled],
                    batch_ids=list(dict.fromkeys(row["batch_id"] for row in canceled)),
                    cancel_reason=reason,
                )
                for queue_id, canceled in by_queue.items()
            ]

        return len(self._cancel_where(where, params, reason, announce))

    def cancel_running(self, item_id: int, reason: str, results: dict[str, dict[str, Any]]) -> bool:
        """For the processor: the running item stopped because it was canceled (or the server is stopping)."""
        return self._finish(item_id, "canceled", cancel_reason=reason, results=json.dumps(results))

    def cancel(self, queue_id: str, item_id: int, reason: str = CANCEL_REASON) -> SessionQueueItem:
        """Cancel a pending or running item; a finished one is returned unchanged."""
        self._cancel_where("queue_id = ? AND item_id = ?", (queue_id, item_id), reason, self._status_events)
        return self.get(queue_id, item_id)

    def cancel_by_batch_ids(self, queue_id: str, batch_ids: Sequence[str], reason: str = CANCEL_REASON) -> int:
        if not batch_ids:
            return 0
        marks = ", ".join("?" for _ in batch_ids)
        return self._cancel_many(f"queue_id = ? AND batch_id IN ({marks})", (queue_id, *batch_ids), reason)

    def _delete_where(self, where: str, params: Sequence[Any]) -> int:
        """Delete items, then the graphs no item uses any more, and give the space back."""
        with self._db.transaction() as cursor:
            deleted = cursor.execute(f"DELETE FROM session_queue WHERE {where}", params).rowcount
            cursor.execute(
                "DELETE FROM session_queue_graphs WHERE NOT EXISTS "
                "(SELECT 1 FROM session_queue q WHERE q.graph_id = session_queue_graphs.graph_id)"
            )
        self._db.reclaim_space()
        return deleted

    def clear(self, queue_id: str) -> int:
        """Delete every item of the queue; a running one is canceled first so that the processor stops it."""
        self._cancel_many("queue_id = ? AND status = 'in_progress'", (queue_id,), "the queue was cleared")
        deleted = self._delete_where("queue_id = ?", (queue_id,))
        self._events.publish(QueueClearedEvent(queue_id=queue_id, deleted=deleted))
        return deleted

    def prune(self, queue_id: str) -> int:
        """Delete the queue's finished (completed, failed, canceled) items, and the images (records and files) of
        its runs that did not complete: those of the items pruned, of items deleted before, and of the earlier runs
        of an item put back to run again. Returns how many items were deleted."""
        marks = ", ".join("?" for _ in FINISHED_STATUSES)
        deleted = self._delete_where(f"queue_id = ? AND status IN ({marks})", (queue_id, *FINISHED_STATUSES))
        if self._images is not None:
            self._prune_incomplete_run_images(self._images, queue_id)
        self._events.publish(QueuePrunedEvent(queue_id=queue_id, deleted=deleted))
        return deleted

    def _prune_incomplete_run_images(self, images: ImageService, queue_id: str) -> int:
        removed = 0
        while True:
            # In batches (bounded statements and memory). An image whose item is gone (pruned just now, or cleared
            # before) goes whichever queue it was of: nothing else would ever remove it.
            rows = self._db.execute(
                "SELECT image_name FROM images WHERE of_incomplete_run = TRUE AND NOT EXISTS "
                "(SELECT 1 FROM session_queue q WHERE q.item_id = images.queue_item_id AND q.queue_id <> ?) LIMIT ?",
                (queue_id, MAX_IMAGE_BATCH),
            )
            if not rows:
                return removed
            removed += len(images.delete_many([row[0] for row in rows]))

    def recover_interrupted(self) -> int:
        """At startup. SQLite has one server per file: an item still in_progress was running when it stopped, and
        is canceled with a reason (or requeued). On PostgreSQL other live servers run items: only those whose
        lease ran out are recovered (the sweep)."""
        if self._db.dialect == "postgresql":
            return self.recover_expired()
        return self._recover("1 = 1", (), RESTART_REASON)

    def is_running(self, item_id: int) -> bool:
        """False once the item was canceled or deleted, or claimed by another worker since this server claimed it:
        the processor's cancel check."""
        rows = self._db.execute("SELECT status, claim_token FROM session_queue WHERE item_id = ?", (item_id,))
        token = self._claims.get(item_id)
        return bool(rows) and rows[0]["status"] == "in_progress" and token in (None, rows[0]["claim_token"])

    def fence(self, item_id: int) -> Fence:
        """The check a write of this item's run makes in its own transaction (see Fence). Taken while the run holds
        its claim: the token is this claim's, whatever happens to the item later."""
        token = self._claims.get(item_id)
        read = f"SELECT status, claim_token FROM session_queue WHERE item_id = ? {for_share(self._db.dialect)}"

        def check(cursor: Cursor) -> None:
            row = cursor.execute(read, (item_id,)).fetchone()
            if row is None or row[0] != "in_progress" or (token is not None and row[1] != token):
                raise NotOwnedError(f"queue item {item_id} is no longer this run's: its write is refused")

        return check

    def get(self, queue_id: str, item_id: int) -> SessionQueueItem:
        rows = self._db.execute(f"{_SELECT_ITEMS} WHERE q.queue_id = ? AND q.item_id = ?", (queue_id, item_id))
        if not rows:
            raise QueueItemNotFoundError(f"queue {queue_id!r} has no item {item_id}")
        return self._items(rows)[0]

    def list_items(
        self, queue_id: str, status: QueueItemStatus | None, offset: int, limit: int
    ) -> tuple[list[SessionQueueItem], int]:
        """A page of the queue's items in the order they run (finished ones in the order they were made)."""
        where, params = (
            ("q.queue_id = ?", [queue_id])
            if status is None
            else ("q.queue_id = ? AND q.status = ?", [queue_id, status])
        )
        with self._db.read_transaction():
            total = self._db.execute(f"SELECT COUNT(*) AS n FROM session_queue q WHERE {where}", params)[0]["n"]
            rows = self._db.execute(
                f"{_SELECT_ITEMS} WHERE {where} ORDER BY q.item_id LIMIT ? OFFSET ?", (*params, limit, offset)
            )
        return self._items(rows), int(total)

    def list_all(self, queue_id: str, destination: str | None = None) -> list[SessionQueueItem]:
        """Every item of the queue (of one destination), in InvokeAI's order: highest priority first, then oldest.
        Raises TooManyItemsError past MAX_LIST_ALL items."""
        where, params = "q.queue_id = ?", [queue_id]
        if destination is not None:
            where, params = where + " AND q.destination = ?", [queue_id, destination]
        with self._db.read_transaction():
            total = int(self._db.execute(f"SELECT COUNT(*) AS n FROM session_queue q WHERE {where}", params)[0]["n"])
            if total > MAX_LIST_ALL:
                raise TooManyItemsError(
                    f"the queue has {total} items{' with this destination' if destination is not None else ''}; "
                    f"list_all answers at most {MAX_LIST_ALL}: page through them with item_ids and items_by_ids, "
                    "or with list?offset=&limit="
                )
            rows = self._db.execute(f"{_SELECT_ITEMS} WHERE {where} ORDER BY q.priority DESC, q.item_id", params)
        return self._items(rows)

    def item_ids(self, queue_id: str, descending: bool = True) -> ItemIdsResult:
        """Every item id of the queue, newest first (or oldest first), as InvokeAI orders them: by creation."""
        direction = "DESC" if descending else "ASC"
        rows = self._db.execute(
            f"SELECT item_id FROM session_queue WHERE queue_id = ? ORDER BY created_at {direction}, "
            f"item_id {direction}",
            (queue_id,),
        )
        ids = [int(row["item_id"]) for row in rows]
        return ItemIdsResult(item_ids=ids, total_count=len(ids))

    def items_by_ids(self, queue_id: str, item_ids: Sequence[int]) -> list[SessionQueueItem]:
        """The items of this queue among `item_ids`, in that order; ids that are missing or of another queue are
        skipped, as InvokeAI skips them."""
        wanted = list(dict.fromkeys(item_ids))
        rows: dict[int, Row] = {}
        for start in range(0, len(wanted), 500):  # SQLite's limit on bound parameters
            chunk = wanted[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            found = self._db.execute(
                f"{_SELECT_ITEMS} WHERE q.queue_id = ? AND q.item_id IN ({marks})", (queue_id, *chunk)
            )
            rows.update({row["item_id"]: row for row in found})
        items = {item.item_id: item for item in self._items(list(rows.values()))}
        return [items[item_id] for item_id in item_ids if item_id in items]

    def recent_models(self, items: int) -> list[str]:
        """The models (model tokens) that the last `items` completed items of every queue named, the most recently
        completed item's first, each once: what a restarted server is likely to be asked for next (the warm-up)."""
        rows = self._db.execute(
            "SELECT models FROM session_queue WHERE status = 'completed' ORDER BY completed_at DESC, item_id DESC "
            "LIMIT ?",
            (items,),
        )
        tokens: dict[str, None] = {}
        for row in rows:
            # A row's tokens are stored sorted: the order within one item carries nothing.
            tokens.update(dict.fromkeys(sorted(read_models_column(row["models"]))))
        return list(tokens)

    def current(self, queue_id: str) -> SessionQueueItem | None:
        """The item in progress (with several workers, the oldest of them), or None."""
        rows = self._db.execute(
            f"{_SELECT_ITEMS} WHERE q.queue_id = ? AND q.status = 'in_progress' ORDER BY q.item_id LIMIT 1",
            (queue_id,),
        )
        return self._items(rows)[0] if rows else None

    def next(self, queue_id: str) -> SessionQueueItem | None:
        """The pending item that runs next (highest priority, then oldest), without claiming it; None if none."""
        rows = self._db.execute(
            f"{_SELECT_ITEMS} WHERE q.queue_id = ? AND q.status = 'pending' ORDER BY q.priority DESC, q.item_id "
            "LIMIT 1",
            (queue_id,),
        )
        return self._items(rows)[0] if rows else None

    def batch_status(self, queue_id: str, batch_id: str) -> BatchStatus:
        """The batch's items per status, and its origin and destination (all 0 and null for an unknown batch)."""
        with self._db.read_transaction():
            counts = self._counts("queue_id = ? AND batch_id = ?", (queue_id, batch_id))
            first = self._db.execute(
                "SELECT origin, destination FROM session_queue WHERE queue_id = ? AND batch_id = ? LIMIT 1",
                (queue_id, batch_id),
            )
        return BatchStatus(
            queue_id=queue_id,
            batch_id=batch_id,
            origin=first[0]["origin"] if first else None,
            destination=first[0]["destination"] if first else None,
            waiting=0,
            total=sum(counts.values()),
            **counts,
        )

    def counts_by_destination(self, queue_id: str, destination: str) -> SessionQueueCountsByDestination:
        counts = self._counts("queue_id = ? AND destination = ?", (queue_id, destination))
        return SessionQueueCountsByDestination(
            queue_id=queue_id, destination=destination, waiting=0, total=sum(counts.values()), **counts
        )

    def cancel_by_destination(self, queue_id: str, destination: str, reason: str = CANCEL_REASON) -> int:
        """Cancel every pending or running item of the destination; returns how many."""
        return self._cancel_many("queue_id = ? AND destination = ?", (queue_id, destination), reason)

    def cancel_all_except_current(self, queue_id: str, reason: str = CANCEL_REASON) -> int:
        """Cancel every pending item of the queue; the running ones run on. Returns how many."""
        return self._cancel_many("queue_id = ? AND status = 'pending'", (queue_id,), reason)

    # The processor's pause, kept in the database so that it lasts across a restart.

    def is_paused(self) -> bool:
        rows = self._db.execute("SELECT paused FROM processor_state WHERE id = 1")
        return bool(rows and rows[0]["paused"])

    def set_paused(self, paused: bool) -> None:
        with self._db.transaction() as cursor:
            cursor.execute("UPDATE processor_state SET paused = ? WHERE id = 1", (int(paused),))

    def counts_by_status(self, queue_id: str | None = None) -> dict[QueueItemStatus, int]:
        return self._counts("1 = 1", ()) if queue_id is None else self._counts("queue_id = ?", (queue_id,))

    def _counts(self, where: str, params: Sequence[Any]) -> dict[QueueItemStatus, int]:
        rows = self._db.execute(
            f"SELECT status, COUNT(*) AS n FROM session_queue WHERE {where} GROUP BY status", params
        )
        counts: dict[QueueItemStatus, int] = dict.fromkeys(QUEUE_ITEM_STATUSES, 0)
        counts.update({row["status"]: int(row["n"]) for row in rows})
        return counts

    def status(self, queue_id: str) -> QueueCounts:
        with self._db.read_transaction():
            counts = self.counts_by_status(queue_id)
            running = self._db.execute(
                "SELECT item_id, batch_id, session_id FROM session_queue WHERE queue_id = ? AND status = 'in_progress'",
                (queue_id,),
            )
        running = sorted(running, key=lambda row: row["item_id"])
        current = running[0] if running else None
        return QueueCounts(
            queue_id=queue_id,
            item_ids=[row["item_id"] for row in running],
            item_id=current["item_id"] if current else None,
            batch_id=current["batch_id"] if current else None,
            session_id=current["session_id"] if current else None,
            waiting=0,
            total=sum(counts.values()),
            **counts,
        )
