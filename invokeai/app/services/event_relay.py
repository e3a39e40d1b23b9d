"""The event relay: with several servers on one PostgreSQL database (`database_url`), every server's events reach
every other server's event bus through LISTEN/NOTIFY on one channel, so that a client subscribed to any server sees
every event of its queue wherever the item runs, and an enqueue anywhere wakes the workers everywhere.

A local event goes out as one NOTIFY whose payload is `{"o": origin, "s": seq, "n": event name, "e": the event}`.
PostgreSQL refuses payloads of 8000 bytes or more, so a larger event is stored in a small table in the same
transaction and the NOTIFY names its row (`"r": id`) instead: nothing is dropped for its size. A step's preview
image stays on the host that runs the item (its progress event goes out without it): docs/scale.md.

Order: one sender thread sends the events in the order they were published, and PostgreSQL delivers notifications
in commit order, so the events of one item arrive in order. `seq` counts each relay's events: the listener drops a
repeat (a batch sent again after a commit whose outcome was lost) and warns of a gap.

A queue status change sends its events in its own transaction instead (notify_in: `seq` null, as such a
notification is committed exactly once, with the change), after flushing what was published before it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from invokeai.app.services.advisory_lock import lock_key
from invokeai.app.services.database import Cursor
from invokeai.app.services.events import EVENT_TYPES, EventBase, EventBus, InvocationProgressEvent
from invokeai.app.services.owned_temporaries import host_name

logger = logging.getLogger(__name__)

CHANNEL = "invokeai_events"
PAYLOAD_TABLE = "event_relay_payloads"
# PostgreSQL's limit is 8000 bytes; an envelope is sent whole below this, and by reference above it.
MAX_NOTIFY_BYTES = 7900
# A stored payload is read within milliseconds; rows older than this are deleted by the sender.
PAYLOAD_KEEP_S = 600.0
_PRUNE_EVERY_S = 60.0
_BATCH = 500
# After an event, the sender waits this long for the ones that follow it (a node's start, its progress, its end)
# and sends them together: each send wakes a thread on every server, and those wake-ups, contending for the GIL with
# the node workers, cost generating servers more than the events themselves.
_LINGER_S = 0.05
# Events waiting while the database is unreachable, at most; beyond it the oldest are dropped, with an error.
MAX_PENDING = 100_000
_POLL_S = 0.5
_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
# Repeated tries to send what is queued when the relay stops with the database unreachable.
_STOP_TRIES = 3
# TCP keepalives: a listener on a connection whose server vanished (power cut) notices within about a minute.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}

_EVENT_TYPES_BY_NAME: dict[str, type[EventBase]] = {event.event_name: event for event in EVENT_TYPES}

_CREATE_TABLE = f"""
CREATE TABLE IF NOT EXISTS {PAYLOAD_TABLE} (
    id BIGSERIAL PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    payload TEXT NOT NULL
)"""
# Sends a run of small envelopes in one statement, in the run's order (ORDER BY the ordinality: pg_notify, a
# volatile function, is evaluated after the sort).
_NOTIFY_MANY = "SELECT pg_notify(%s, note) FROM unnest(%s::text[]) WITH ORDINALITY AS t(note, i) ORDER BY i"
_NOTIFY_STORED = f"""
WITH stored AS (INSERT INTO {PAYLOAD_TABLE} (payload) VALUES (%s) RETURNING id)
SELECT pg_notify(%s, json_build_object('o', %s::text, 's', %s::bigint, 'n', %s::text, 'r', stored.id)::text)
FROM stored"""


# Other servers get a running node's progress at most this often, and always its last step. Relayed at every step,
# the events' sending and receiving threads took a tenth of two generating servers' throughput on a 2-core machine
# (benchmarks/queue_scale.py); a client watching another server's item still sees it move several times a second.
PROGRESS_INTERVAL_S = 0.25
_PROGRESS_KEYS = 1000  # nodes whose last relayed step is remembered; canceled ones never reach their last step


@dataclass(frozen=True)
class _Outgoing:
    seq: int
    name: str
    data: str  # the event's JSON


def relayed_form(event: EventBase) -> EventBase:
    """The event as other servers get it: a progress event without its preview image, which stays on the host
    running the item (a preview per step for every host would outgrow NOTIFY and cost each step a JPEG)."""
    if isinstance(event, InvocationProgressEvent) and event.image is not None:
        return event.model_copy(update={"image": None})
    return event


class EventRelay:
    """Relays the local bus's events to the other servers on `database_url`, and theirs into the local bus.

    Two threads, each with its own connection: the sender (NOTIFY) and the listener (LISTEN), which reconnects
    after a drop with a logged warning. After a reconnect it ends the local event streams (events of that gap are
    lost: a client reconnects and re-reads the queue, as after an overflow) and calls the `on_resync` callbacks (the
    processor looks for items an unseen enqueue added)."""

    def __init__(self, database_url: str, events: EventBus, *, origin: str | None = None) -> None:
        self.database_url = database_url
        # Unique per relay: two servers on one host (or two relays in one test process) are told apart.
        self.origin = origin or f"{host_name()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.reconnects = 0
        self._events = events
        self._outbox: queue.Queue[_Outgoing | None] = queue.Queue()
        self._seq = 0
        self._seq_lock = threading.Lock()
        # The highest seq committed by the sender, and what wakes a flush waiting for it; `_hurry` cuts the
        # sender's wait for more events short when a flush wants them out now.
        self._sent = 0
        self._sent_changed = threading.Condition()
        self._hurry = threading.Event()
        self._republishing = threading.local()
        self._stop = threading.Event()
        self._started = False
        self._last_seen: dict[str, int] = {}
        self._progress_sent: dict[tuple[int, str], float] = {}  # (item, node) -> when its progress was last sent
        self._resync: list[Callable[[], None]] = []
        self._sender: threading.Thread | None = None
        self._listener: threading.Thread | None = None
        self._listen_conn: psycopg.Connection[Any] | None = None
        # The connections' backends (pg_stat_activity), once connected.
        self.listener_pid: int | None = None
        self.sender_pid: int | None = None

    # Control.

    def on_resync(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (on the listener thread) after a reconnect, when events may have been missed."""
        self._resync.append(callback)

    def start(self) -> None:
        """Create the payload table if needed and listen; returns once listening, so an event another server
        publishes after this returns reaches the local bus. Raises psycopg.Error if the database is unreachable."""
        with self._connect("sender") as conn, conn.transaction():
            # CREATE TABLE IF NOT EXISTS is not safe against itself: two servers starting at once take turns.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(PAYLOAD_TABLE),))
            conn.execute(_CREATE_TABLE)
        self._listen_conn = self._connect_listener()
        self._stop.clear()
        self._started = True
        self._events.add_listener(self._forward, forwards=True)
        self._sender = threading.Thread(target=self._send_loop, name="event-relay-sender", daemon=True)
        self._listener = threading.Thread(target=self._listen_loop, name="event-relay-listener", daemon=True)
        self._sender.start()
        self._listener.start()
        logger.info("Relaying events through PostgreSQL (channel %s) as %s", CHANNEL, self.origin)

    def stop(self, timeout: float = 10.0) -> None:
        """Send what is queued (a few tries if the database is unreachable), then stop both threads."""
        if not self._started:
            return
        self._started = False
        self._outbox.put(None)
        if self._sender is not None:
            self._sender.join(timeout)
        self._stop.set()
        if self._listener is not None:
            self._listener.join(timeout)

    # Outgoing: on the publishing thread, then the sender thread.

    def _forward(self, event: EventBase) -> None:
        if not self._started or getattr(self._republishing, "active", False):
            return  # an event from another server, being delivered here: it is not sent back
        if isinstance(event, InvocationProgressEvent) and not self._progress_due(event):
            return
        data = relayed_form(event).model_dump_json()
        with self._seq_lock:
            # Numbered and queued under one lock: the sender sends in seq order.
            self._seq += 1
            self._outbox.put(_Outgoing(self._seq, event.event_name, data))

    def _progress_due(self, event: InvocationProgressEvent) -> bool:
        key = (event.item_id, event.node_id)
        if event.step >= event.total:
            self._progress_sent.pop(key, None)
            return True
        now = time.monotonic()
        if now - self._progress_sent.get(key, -PROGRESS_INTERVAL_S) < PROGRESS_INTERVAL_S:
            return False
        if len(self._progress_sent) >= _PROGRESS_KEYS:
            self._progress_sent.clear()
        self._progress_sent[key] = now
        return True

    def _envelope(self, item: _Outgoing) -> str:
        return f'{{"o":{json.dumps(self.origin)},"s":{item.seq},"n":{json.dumps(item.name)},"e":{item.data}}}'

    def _take_batch(self) -> tuple[list[_Outgoing], bool]:
        """The next events to send, waiting for the first; and whether the relay is stopping after them."""
        first = self._outbox.get()
        if first is None:
            return [], True
        self._hurry.wait(_LINGER_S)
        self._hurry.clear()
        batch = [first]
        while len(batch) < _BATCH:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _send_loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        batch: list[_Outgoing] = []
        stopping = False
        failures = 0
        last_prune = 0.0
        while True:
            if not batch:
                if stopping:
                    break
                batch, stopping = self._take_batch()
                if not batch:
                    break
            try:
                if conn is None:
                    conn = self._connect("sender")
                    self.sender_pid = conn.info.backend_pid
                self._send(conn, batch)
                self._mark_sent(batch)
                if failures:
                    logger.warning("The event relay sends events again (after %d failed tries)", failures)
                batch, failures = [], 0
                if time.monotonic() - last_prune > _PRUNE_EVERY_S:
                    last_prune = time.monotonic()
                    conn.execute(
                        f"DELETE FROM {PAYLOAD_TABLE} WHERE created_at < now() - make_interval(secs => %s)",
                        (PAYLOAD_KEEP_S,),
                    )
            except psycopg.OperationalError as error:
                failures += 1
                if failures == 1:
                    logger.warning("The event relay could not send %d events (%s); retrying", len(batch), error)
                conn = _closed(conn)
                # Stopping (or asked to, while this batch kept failing): a few tries, then give up, saying so.
                if (stopping or not self._started) and failures >= _STOP_TRIES:
                    lost = len(batch) + self._outbox.qsize()
                    logger.error("The event relay stops with %d events not sent to the other servers", lost)
                    break
                time.sleep(_BACKOFF_S[min(failures, len(_BACKOFF_S)) - 1])
                self._shed_excess()
            except psycopg.Error:
                # Not the connection: an event the database refuses. The others of its batch must still go.
                if conn is not None and not conn.closed:
                    self._send_each(conn, batch)
                batch = []
        _closed(conn)

    def _send_each(self, conn: psycopg.Connection[Any], batch: list[_Outgoing]) -> None:
        for item in batch:
            try:
                self._send(conn, [item])
            except psycopg.Error as error:
                logger.error(
                    "The event relay could not send a %s event (%s); the other servers miss it", item.name, error
                )
        self._mark_sent(batch)

    def _mark_sent(self, batch: list[_Outgoing]) -> None:
        if batch:
            with self._sent_changed:
                self._sent = max(self._sent, batch[-1].seq)
                self._sent_changed.notify_all()

    # A queue status change's events, in its own transaction.

    def flush(self, timeout: float) -> bool:
        """Send every event published so far now (no waiting for more), and wait until they are committed; False
        if that took longer than `timeout` seconds (the database away: the caller's own change fails too)."""
        if not self._started:
            return True
        with self._seq_lock:
            target = self._seq
        with self._sent_changed:
            if self._sent >= target:
                return True
            self._hurry.set()
            return self._sent_changed.wait_for(lambda: self._sent >= target, timeout)

    def notify_in(self, cursor: Cursor, events: Sequence[EventBase]) -> None:
        """Send `events` in the transaction of `cursor` (on this relay's database): the other servers get them
        when it commits, and never if it rolls back. No `seq`: a transaction commits once, so nothing to dedupe."""
        for event in events:
            data = relayed_form(event).model_dump_json()
            envelope = f'{{"o":{json.dumps(self.origin)},"s":null,"n":{json.dumps(event.event_name)},"e":{data}}}'
            if len(envelope.encode()) < MAX_NOTIFY_BYTES:
                cursor.execute("SELECT pg_notify(?, ?)", (CHANNEL, envelope))
                continue
            stored = cursor.execute(f"INSERT INTO {PAYLOAD_TABLE} (payload) VALUES (?) RETURNING id", (data,))
            reference = {"o": self.origin, "s": None, "n": event.event_name, "r": stored.fetchone()[0]}
            cursor.execute("SELECT pg_notify(?, ?)", (CHANNEL, json.dumps(reference)))

    def publish_sent(self, event: EventBase) -> None:
        """Publish on this server's bus an event that notify_in has sent: the relay does not send it again."""
        self._republishing.active = True
        try:
            self._events.publish(event)
        finally:
            self._republishing.active = False

    def _shed_excess(self) -> None:
        excess = self._outbox.qsize() - MAX_PENDING
        dropped = 0
        while dropped < excess:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                break
            if item is None:  # keep the stop request
                self._outbox.put(None)
                break
            dropped += 1
        if dropped:
            logger.error("The database is unreachable: dropped %d events queued for the other servers", dropped)

    def _send(self, conn: psycopg.Connection[Any], batch: list[_Outgoing]) -> None:
        """One transaction: its notifications are delivered together, in the order sent, once it commits."""
        with conn.transaction():
            small: list[str] = []
            for item in batch:
                envelope = self._envelope(item)
                if len(envelope.encode()) < MAX_NOTIFY_BYTES:
                    small.append(envelope)
                    continue
                if small:
                    conn.execute(_NOTIFY_MANY, (CHANNEL, small))
                    small = []
                conn.execute(_NOTIFY_STORED, (item.data, CHANNEL, self.origin, item.seq, item.name))
            if small:
                conn.execute(_NOTIFY_MANY, (CHANNEL, small))

    # Incoming: the listener thread.

    def _listen_loop(self) -> None:
        conn = self._listen_conn
        failures = 0
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connect_listener()
                    self.reconnects += 1
                    failures = 0
                    logger.warning(
                        "The event relay listens again; events the other servers sent meanwhile are lost: "
                        "ending this server's event streams, whose clients reconnect and re-read the queue"
                    )
                    self._after_gap()
                # stop_after=1: the notifications of one packet, then out of the generator (which holds the
                # connection), so that a stored payload can be read on the same connection.
                received = list(conn.notifies(timeout=_POLL_S, stop_after=1))
                for note in received:
                    self._receive(conn, note.payload)
            except psycopg.Error as error:
                if self._stop.is_set():
                    break
                failures += 1
                if failures == 1:
                    logger.warning("The event relay lost its connection to PostgreSQL (%s); reconnecting", error)
                conn = _closed(conn)
                self._stop.wait(_BACKOFF_S[min(failures, len(_BACKOFF_S)) - 1])
        _closed(conn)

    def _after_gap(self) -> None:
        self._events.end_streams()
        for callback in self._resync:
            try:
                callback()
            except Exception:
                logger.exception("An event relay resync callback failed")

    def _receive(self, conn: psycopg.Connection[Any], payload: str) -> None:
        try:
            envelope = json.loads(payload)
            origin, name = str(envelope["o"]), str(envelope["n"])
            # None: sent in a queue change's own transaction (notify_in), committed once: nothing to dedupe.
            seq = None if envelope["s"] is None else int(envelope["s"])
        except (ValueError, KeyError, TypeError):
            logger.warning("The event relay ignored a notification it cannot read: %.200s", payload)
            return
        if origin == self.origin:
            return  # its own, echoed back by PostgreSQL
        last = self._last_seen.get(origin)
        if seq is not None and last is not None and seq <= last:
            return  # sent again by a sender that could not tell whether its commit went through
        if seq is not None and last is not None and seq > last + 1:
            logger.warning("The event relay missed %d events from %s", seq - last - 1, origin)
        if seq is not None:
            self._last_seen[origin] = seq
        event_type = _EVENT_TYPES_BY_NAME.get(name)
        if event_type is None:
            logger.warning("The event relay ignored an event it does not know, %r, from %s", name, origin)
            return
        try:
            if "r" in envelope:
                row = conn.execute(f"SELECT payload FROM {PAYLOAD_TABLE} WHERE id = %s", (envelope["r"],)).fetchone()
                if row is None:
                    logger.error("The event relay lost a large %s event from %s: its row was deleted", name, origin)
                    return
                event = event_type.model_validate_json(row[0])
            else:
                event = event_type.model_validate(envelope["e"])
        except ValueError as error:  # pydantic's ValidationError among them
            logger.warning("The event relay ignored a %s event from %s it cannot read: %s", name, origin, error)
            return
        self._republishing.active = True
        try:
            self._events.publish(event)
        finally:
            self._republishing.active = False

    # Connections.

    def _connect(self, role: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.database_url,
            autocommit=True,
            connect_timeout=10,
            application_name=f"invokeai-relay-{role}",
            **_KEEPALIVES,
        )

    def _connect_listener(self) -> psycopg.Connection[Any]:
        conn = self._connect("listener")
        try:
            conn.execute(f"LISTEN {CHANNEL}")
        except BaseException:
            conn.close()
            raise
        self.listener_pid = conn.info.backend_pid
        return conn


def _closed(conn: psycopg.Connection[Any] | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except psycopg.Error:
            pass
    return None
