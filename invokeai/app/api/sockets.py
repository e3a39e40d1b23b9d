"""InvokeAI's Socket.IO events at /ws/socket.io (python-socketio's ASGI server), beside the SSE stream: one event bus,
two transports (docs/api.md, "Events").

The server is a sink of the bus (EventSink): every event it takes goes out under its event name, with the same JSON
payload as on the SSE stream, so events added to the bus later (model loads, installs) need nothing here. A queue's
events go to the clients that sent `subscribe_queue` for it (the room `queue:<id>`); events of no queue (the model
events) go to every connected client, as InvokeAI sends them to every socket of a single-user server. The bus carries
the events of the other servers on the same PostgreSQL database too (event_relay.py), so they reach these clients.

With the api_token setting set, the handshake needs the token: `auth` {"token": ...} or an `Authorization: Bearer`
header, as InvokeAI's web UI sends both. Each client is bounded: at most MAX_QUEUES subscriptions, a message rate
(a token bucket of MESSAGE_BURST, refilled at MESSAGES_PER_SECOND), MAX_MESSAGE_BYTES per message, and a backlog of
MAX_BACKLOG packets not yet sent to it. A client over a bound is told why (a `socket_error` event) and cut off.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import socketio
from socketio.exceptions import ConnectionRefusedError as RefusedError

from invokeai.app.api.auth import bearer_token, expected_digest, token_matches
from invokeai.app.api.request_guard import AllowedOrigins
from invokeai.app.services.events import EventBase, EventBus
from invokeai.app.services.queue_models import ID_PATTERN

logger = logging.getLogger(__name__)

# Where InvokeAI serves it, and where its clients (its web UI, invokeai-py-client) connect.
MOUNT_PATH = "/ws"
SOCKETIO_PATH = "/ws/socket.io"
ERROR_EVENT = "socket_error"
NAMESPACE = "/"

MAX_QUEUES = 16
# A client sends a few messages when it connects (InvokeAI's web UI: two); a burst of 60 and 5 a second leave
# ample room for resubscribing, and cut off a client that sends messages in a loop within a second or two.
MESSAGE_BURST = 60
MESSAGES_PER_SECOND = 5.0
# A subscription is a few dozen bytes; nothing a client sends needs more (HTTP polling bodies included).
MAX_MESSAGE_BYTES = 64 * 1024
# Packets waiting for one client (a slow reader: previews are a few kB each); its connection ends beyond this.
MAX_BACKLOG = 500
BACKLOG_CHECK_S = 1.0
# Events waiting for this server's loop; beyond it (a starved loop) every client is cut off, as SSE streams end on
# overflow: a client reconnects and re-reads rather than trusting a connection that lost events.
MAX_PENDING = 1000
# A refused handshake's engine.io session is closed this long after the refusal was sent.
REFUSED_CLOSE_S = 0.2
MAX_BULK_DOWNLOAD_ID = 256

_QUEUE_ID = re.compile(ID_PATTERN)


def _server_wide(event: EventBase) -> bool:
    # Model events have no queue (ModelEventBase); those of InvokeAI's model_*/download_* names go to every client
    # too, whatever queue_id a later event of those names may carry, as InvokeAI sends them.
    return event.queue_id is None or event.event_name.startswith(("model_", "download_"))


def _takes_server_wide(event_name: str, queue_id: str | None) -> bool:
    return queue_id is None or event_name.startswith(("model_", "download_"))


def _room(queue_id: str) -> str:
    # Prefixed: a bare queue id could name another client's own room (python-socketio's room per sid).
    return f"queue:{queue_id}"


@dataclass
class _Client:
    queues: set[str] = field(default_factory=set)
    allowance: float = MESSAGE_BURST
    refilled: float = field(default_factory=time.monotonic)


class SocketServer:
    """The Socket.IO server: mount `app` at MOUNT_PATH, then start(bus) on the server's loop and stop() at the end."""

    def __init__(self, api_token: str, origins: AllowedOrigins) -> None:
        self._expected = expected_digest(api_token)

        def allowed(origin: str | None, environ: dict[str, Any]) -> bool:
            # engine.io's origin check, on every request (polling GETs too, which the request guard lets through):
            # the pages of the origins REST takes changes from; clients without Origin (scripts) are not browsers.
            # The scheme of the ASGI scope (which trusts X-Forwarded-Proto only from a trusted proxy, as uvicorn
            # sets it), not engine.io's wsgi.url_scheme (which takes that header from anyone).
            scheme = environ["asgi.scope"].get("scheme", "http")
            return origin is None or origins.allows(origin, scheme, environ.get("HTTP_HOST"))

        self.server = socketio.AsyncServer(
            async_mode="asgi",
            cors_allowed_origins=allowed,
            # In order and one at a time per connection: a subscribe then an unsubscribe take effect in that order,
            # and a client that floods waits for its own messages (the rate bound cuts it off).
            async_handlers=False,
            max_http_buffer_size=MAX_MESSAGE_BYTES,
            logger=False,
            engineio_logger=False,
        )
        self.app = socketio.ASGIApp(self.server, socketio_path=SOCKETIO_PATH)
        self._clients: dict[str, _Client] = {}
        self._members: dict[str, set[str]] = {}  # queue id -> the clients subscribed to it
        # Read by takes() on publishing threads: replaced whole, never changed in place.
        self._wanted: frozenset[str] = frozenset()
        self._connected = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.Queue[EventBase] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._bus: EventBus | None = None
        self._backlog_checked = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self.server.on("connect", self._on_connect)
        self.server.on("disconnect", self._on_disconnect)
        self.server.on("subscribe_queue", self._on_subscribe_queue)
        self.server.on("unsubscribe_queue", self._on_unsubscribe_queue)
        # InvokeAI's web UI subscribes to its bulk downloads, which this server does not make: taken, and ignored.
        self.server.on("subscribe_bulk_download", self._on_bulk_download)
        self.server.on("unsubscribe_bulk_download", self._on_bulk_download)
        self.server.on("*", self._on_other)
        self._socketio_eio_disconnect = self.server.eio.handlers.get("disconnect")
        self.server.eio.on("disconnect", self._on_engine_disconnect)

    # Life, on the server's loop.

    def start(self, bus: EventBus) -> None:
        self._loop = asyncio.get_running_loop()
        self._pending = asyncio.Queue()
        self._pump = asyncio.create_task(self._send_events(), name="socketio-events")
        self._bus = bus
        bus.attach(self)

    async def stop(self) -> None:
        if self._bus is not None:
            self._bus.detach(self)
        if self._pump is not None:
            self._pump.cancel()
        for sid in list(self._clients):
            await self._cut_off(sid)
        await self.server.shutdown()

    @property
    def client_count(self) -> int:
        return self._connected

    def subscribers(self, queue_id: str) -> int:
        return len(self._members.get(queue_id, ()))

    # The bus's side (EventSink): any thread.

    def takes(self, event_name: str, queue_id: str | None) -> bool:
        if _takes_server_wide(event_name, queue_id):
            return self._connected > 0
        return queue_id in self._wanted

    def deliver(self, event: EventBase) -> None:
        self._call_soon(self._enqueue, event)

    def streams_ended(self) -> None:
        # Events were lost (the relay reconnected) or the server stops: clients reconnect and re-read the queue.
        self._call_soon(self._cut_off_everyone)

    def _call_soon(self, callback: Any, *args: Any) -> None:
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    # Sending, on the loop.

    def _enqueue(self, event: EventBase) -> None:
        assert self._pending is not None
        if self._pending.qsize() >= MAX_PENDING:
            logger.warning("The Socket.IO server fell %d events behind; disconnecting its clients", MAX_PENDING)
            while not self._pending.empty():
                self._pending.get_nowait()
            self._cut_off_everyone()
            return
        self._pending.put_nowait(event)

    async def _send_events(self) -> None:
        assert self._pending is not None
        while True:
            event = await self._pending.get()
            try:
                data = event.model_dump(mode="json")
                if _server_wide(event):
                    await self.server.emit(event.event_name, data, namespace=NAMESPACE)
                elif event.queue_id in self._members:
                    await self.server.emit(event.event_name, data, to=_room(event.queue_id), namespace=NAMESPACE)
            except Exception:
                logger.exception("The Socket.IO server could not send a %s event", event.event_name)
            self._check_backlogs()

    def _check_backlogs(self) -> None:
        now = time.monotonic()
        if now - self._backlog_checked < BACKLOG_CHECK_S:
            return
        self._backlog_checked = now
        for sid in list(self._clients):
            backlog = self._backlog(sid)
            if backlog > MAX_BACKLOG:
                logger.warning("Socket.IO client %s has %d packets not yet sent; disconnecting it", sid, backlog)
                self._spawn(self._cut_off(sid))

    def _backlog(self, sid: str) -> int:
        eio_sid = self.server.manager.eio_sid_from_sid(sid, NAMESPACE)
        socket = self.server.eio.sockets.get(eio_sid) if eio_sid is not None else None
        queue = getattr(socket, "queue", None)
        return queue.qsize() if queue is not None else 0

    # Clients.

    async def _on_engine_disconnect(self, eio_sid: str, *args: Any) -> None:
        """A closed engine.io session: python-socketio's own handling, then a long poll still waiting on the session
        (a client that closed while its GET was pending) is answered now, not when its poll times out after
        ping_interval + ping_timeout; the server's shutdown would wait for it."""
        if self._socketio_eio_disconnect is not None:
            await self._socketio_eio_disconnect(eio_sid, *args)
        socket = self.server.eio.sockets.get(eio_sid)
        queue = getattr(socket, "queue", None)
        if queue is not None and getattr(socket, "upgraded", True) is False:
            queue.put_nowait(None)  # engine.io's own "closed" mark: the poll returns with nothing

    async def _on_connect(self, sid: str, environ: dict[str, Any], auth: Any = None) -> None:
        if self._expected is not None and not self._authorized(environ, auth):
            eio_sid = self.server.manager.eio_sid_from_sid(sid, NAMESPACE)
            if eio_sid is not None and self._loop is not None:
                self._loop.call_later(REFUSED_CLOSE_S, lambda: self._spawn(self._close_engine(eio_sid)))
            raise RefusedError(
                'the server\'s api_token setting is set: send the token as auth {"token": ...} or an '
                "'Authorization: Bearer <token>' header"
            )
        self._clients[sid] = _Client()
        self._connected = len(self._clients)

    def _authorized(self, environ: dict[str, Any], auth: Any) -> bool:
        given: bytes | None = None
        if isinstance(auth, dict) and isinstance(auth.get("token"), str) and auth["token"]:
            try:
                given = auth["token"].encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: no token matches it
                return False
        elif "asgi.scope" in environ:
            given = bearer_token(environ["asgi.scope"])
        return bool(given) and token_matches(self._expected, given or b"")

    async def _on_disconnect(self, sid: str, reason: Any = None) -> None:
        self._forget(sid)

    def _forget(self, sid: str) -> _Client | None:
        client = self._clients.pop(sid, None)
        if client is None:
            return None
        for queue_id in client.queues:
            members = self._members.get(queue_id)
            if members is not None:
                members.discard(sid)
                if not members:
                    del self._members[queue_id]
        self._wanted = frozenset(self._members)
        self._connected = len(self._clients)
        return client

    async def _on_subscribe_queue(self, sid: str, *args: Any) -> None:
        client = await self._admit(sid)
        if client is None:
            return
        queue_id = await self._queue_id(sid, "subscribe_queue", args)
        if queue_id is None or queue_id in client.queues:
            return
        if len(client.queues) >= MAX_QUEUES:
            await self._refuse(sid, "subscribe_queue", f"a client may subscribe to at most {MAX_QUEUES} queues")
            await self._cut_off(sid)
            return
        client.queues.add(queue_id)
        self._members.setdefault(queue_id, set()).add(sid)
        self._wanted = frozenset(self._members)
        await self.server.enter_room(sid, _room(queue_id), namespace=NAMESPACE)

    async def _on_unsubscribe_queue(self, sid: str, *args: Any) -> None:
        client = await self._admit(sid)
        if client is None:
            return
        queue_id = await self._queue_id(sid, "unsubscribe_queue", args)
        if queue_id is None or queue_id not in client.queues:
            return
        client.queues.discard(queue_id)
        members = self._members.get(queue_id, set())
        members.discard(sid)
        if not members:
            self._members.pop(queue_id, None)
        self._wanted = frozenset(self._members)
        await self.server.leave_room(sid, _room(queue_id), namespace=NAMESPACE)

    async def _on_bulk_download(self, sid: str, *args: Any) -> None:
        if await self._admit(sid) is None:
            return
        data = args[0] if len(args) == 1 else None
        value = data.get("bulk_download_id") if isinstance(data, dict) else None
        if not isinstance(value, str) or not 0 < len(value) <= MAX_BULK_DOWNLOAD_ID:
            await self._refuse(
                sid,
                "subscribe_bulk_download",
                f'takes {{"bulk_download_id": <1 to {MAX_BULK_DOWNLOAD_ID} characters>}}',
            )

    async def _on_other(self, event: str, sid: str, *args: Any) -> None:
        # Any other message is ignored, but counts against the client's rate.
        await self._admit(sid)

    async def _admit(self, sid: str) -> _Client | None:
        """The client, having spent one message of its allowance; None once it has none left (it is cut off)."""
        client = self._clients.get(sid)
        if client is None:
            return None
        now = time.monotonic()
        client.allowance = min(MESSAGE_BURST, client.allowance + (now - client.refilled) * MESSAGES_PER_SECOND)
        client.refilled = now
        if client.allowance < 1.0:
            logger.warning("Socket.IO client %s sent messages faster than %s a second; disconnecting it", sid,
                           MESSAGES_PER_SECOND)  # fmt: skip
            await self._refuse(
                sid, "*", f"more than {MESSAGE_BURST} messages at once, or {MESSAGES_PER_SECOND:g} a second"
            )
            await self._cut_off(sid)
            return None
        client.allowance -= 1.0
        return client

    async def _queue_id(self, sid: str, event: str, args: tuple[Any, ...]) -> str | None:
        data = args[0] if len(args) == 1 else None
        queue_id = data.get("queue_id") if isinstance(data, dict) else None
        if isinstance(queue_id, str) and _QUEUE_ID.fullmatch(queue_id):
            return queue_id
        await self._refuse(sid, event, f'takes {{"queue_id": <a queue id matching {ID_PATTERN}>}}')
        return None

    async def _refuse(self, sid: str, event: str, message: str) -> None:
        await self.server.emit(ERROR_EVENT, {"event": event, "message": message}, to=sid, namespace=NAMESPACE)

    async def _cut_off(self, sid: str) -> None:
        """End the client's connection now: it leaves its rooms at once, and its engine.io session is closed
        without waiting for what is queued for it (a client that does not read would hold the close up)."""
        self._forget(sid)
        eio_sid = self.server.manager.eio_sid_from_sid(sid, NAMESPACE)
        try:
            await self.server.disconnect(sid, namespace=NAMESPACE)
        except Exception:
            logger.debug("Socket.IO client %s was already gone", sid, exc_info=True)
        if eio_sid is not None:
            await self._close_engine(eio_sid)

    async def _close_engine(self, eio_sid: str) -> None:
        socket = self.server.eio.sockets.get(eio_sid)
        if socket is not None:
            try:
                await socket.close(wait=False, abort=False)
            except Exception:
                logger.debug("The engine.io session %s was already closed", eio_sid, exc_info=True)

    def _cut_off_everyone(self) -> None:
        for sid in list(self._clients):
            self._spawn(self._cut_off(sid))

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def mount_socketio(app: Any, api_token: str, origins: AllowedOrigins) -> SocketServer:
    """Serve Socket.IO at SOCKETIO_PATH: a mount, so that neither the web UI's fallback nor the token middleware
    (which guards /api/ only) sees its requests; the handshake checks the token itself."""
    sockets = SocketServer(api_token, origins)
    app.mount(MOUNT_PATH, sockets.app)
    return sockets
