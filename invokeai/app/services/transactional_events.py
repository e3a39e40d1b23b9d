"""What the session queue asks of the event relay so that a status change and the events announcing it commit
together: PostgreSQL delivers a NOTIFY when its transaction commits, and never when it rolls back, so a server
killed right after the commit cannot lose the event, and a change that is undone sends none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from invokeai.app.services.database import Cursor
from invokeai.app.services.events import EventBase

# How long a status change waits for the events published before it to go out first (the node's own events: the
# other servers get an item's events in order). Bounded: with the database away the change itself fails anyway.
FLUSH_WAIT_S = 1.0


class TransactionalEvents(Protocol):
    def flush(self, timeout: float) -> bool:
        """Send every event published so far now, and wait (up to `timeout` s) until they are committed."""
        ...

    def notify_in(self, cursor: Cursor, events: Sequence[EventBase]) -> None:
        """Send `events` to the other servers in the transaction of `cursor`: delivered if and when it commits."""
        ...

    def publish_sent(self, event: EventBase) -> None:
        """Publish, on this server's bus, an event already sent by notify_in (so it is not sent a second time)."""
        ...
