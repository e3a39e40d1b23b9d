"""Migration 6: what a queue item needs from a worker, and which worker holds it.

- `models`: the models the item's graph uses (a JSON list, batch data applied), so a free worker can prefer an item
  whose models are already on its device.
- `worker`: who runs (or ran) the item, `<host>:<pid>/<worker>`, set when it is claimed.
- `lease_expires_at`: while the item runs, its server renews this (ISO 8601 UTC, as every stored time); an item
  whose lease ran out belongs to a server that stopped, and another server recovers it.

Plain `ADD COLUMN`s: the same statements run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from invokeai.app.services.database import Cursor
from invokeai.app.services.migrations.base import Migration


def _apply(cursor: Cursor) -> None:
    cursor.execute("ALTER TABLE session_queue ADD COLUMN models TEXT")
    cursor.execute("ALTER TABLE session_queue ADD COLUMN worker TEXT")
    cursor.execute("ALTER TABLE session_queue ADD COLUMN lease_expires_at TEXT")
    # The recovery sweep's question, "which running item's lease ran out", is answered from this index.
    cursor.execute("CREATE INDEX session_queue_lease ON session_queue (status, lease_expires_at)")


migration = Migration(version=6, description="queue item models, worker and lease", apply=_apply)
