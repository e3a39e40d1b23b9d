"""Migration 4: a batch's graph is stored once, not once per queue item; retried items link to their original; the
processor's pause is kept across restarts.

Before it, every item held its own copy of the graph: a 200 KB graph enqueued with runs 500 wrote 100 MB (200 MB
with the WAL). Now `session_queue_graphs` holds the graph as the client sent it (before batch data is put in), and
an item holds only its `field_values`, which are put into the graph again when the item is read.
"""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration, never_reused_id

_QUEUE_COLUMNS = (
    "item_id, queue_id, batch_id, session_id, status, priority, field_values, results, error_type, error_message, "
    "error_traceback, cancel_reason, created_at, updated_at, started_at, completed_at"
)


_PROCESSOR_STATE = """
CREATE TABLE processor_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    paused INTEGER NOT NULL DEFAULT 0
)
"""


def _apply(cursor: Cursor) -> None:
    cursor.execute(
        f"""
        CREATE TABLE session_queue_graphs (
            graph_id {never_reused_id(cursor)},
            graph TEXT NOT NULL
        )
        """
    )
    if cursor.dialect == "postgresql":
        _alter_in_place(cursor)
    else:
        _rebuild(cursor)
    cursor.execute(_PROCESSOR_STATE)
    cursor.execute("INSERT INTO processor_state (id, paused) VALUES (1, 0)")


def _alter_in_place(cursor: Cursor) -> None:
    """PostgreSQL alters the table in place: items keep their ids and the identity its counter."""
    cursor.execute("ALTER TABLE session_queue ADD COLUMN graph_id BIGINT REFERENCES session_queue_graphs (graph_id)")
    cursor.execute("ALTER TABLE session_queue ADD COLUMN retried_from_item_id BIGINT")
    cursor.execute("INSERT INTO session_queue_graphs (graph) SELECT DISTINCT graph FROM session_queue")
    cursor.execute(
        "UPDATE session_queue SET graph_id = g.graph_id FROM session_queue_graphs g WHERE g.graph = session_queue.graph"
    )
    cursor.execute("ALTER TABLE session_queue ALTER COLUMN graph_id SET NOT NULL")
    cursor.execute("ALTER TABLE session_queue DROP COLUMN graph")
    cursor.execute("CREATE INDEX session_queue_graph ON session_queue (graph_id)")


def _rebuild(cursor: Cursor) -> None:
    # SQLite cannot drop a column's NOT NULL in place: the table is rebuilt, keeping every item and its id.
    cursor.execute(
        """
        CREATE TABLE session_queue_new (
            item_id INTEGER PRIMARY KEY AUTOINCREMENT,
            queue_id TEXT NOT NULL,
            batch_id TEXT NOT NULL,
            session_id TEXT NOT NULL UNIQUE,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'in_progress', 'completed', 'failed', 'canceled')),
            priority INTEGER NOT NULL DEFAULT 0,
            graph_id INTEGER NOT NULL REFERENCES session_queue_graphs (graph_id),
            field_values TEXT,
            retried_from_item_id INTEGER,
            results TEXT,
            error_type TEXT,
            error_message TEXT,
            error_traceback TEXT,
            cancel_reason TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            started_at TEXT,
            completed_at TEXT
        )
        """
    )
    # Old items keep the graph they had, batch data already in it (putting their field values in again when they
    # are read changes nothing); equal graphs share one row.
    cursor.execute("INSERT INTO session_queue_graphs (graph) SELECT DISTINCT graph FROM session_queue")
    cursor.execute(
        f"INSERT INTO session_queue_new ({_QUEUE_COLUMNS}, graph_id) "
        f"SELECT {', '.join('q.' + c.strip() for c in _QUEUE_COLUMNS.split(','))}, g.graph_id "
        "FROM session_queue q JOIN session_queue_graphs g ON g.graph = q.graph"
    )
    # An item id is never reused (see migration 2): carry the counter over, also past pruned items.
    seq = cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = 'session_queue'").fetchone()
    cursor.execute("DROP TABLE session_queue")
    cursor.execute("ALTER TABLE session_queue_new RENAME TO session_queue")
    if seq is not None:
        cursor.execute("DELETE FROM sqlite_sequence WHERE name = 'session_queue'")
        cursor.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('session_queue', ?)", (seq[0],))
    cursor.execute("CREATE INDEX session_queue_next ON session_queue (status, priority DESC, item_id)")
    cursor.execute("CREATE INDEX session_queue_queue_status ON session_queue (queue_id, status)")
    cursor.execute("CREATE INDEX session_queue_batch ON session_queue (batch_id)")
    # Deleting items deletes the graphs no item uses any more; this index answers "is it still used".
    cursor.execute("CREATE INDEX session_queue_graph ON session_queue (graph_id)")


migration = Migration(
    version=4, description="queue graphs stored once per batch, retries, persisted pause", apply=_apply
)
