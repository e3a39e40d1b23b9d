"""Requests refused before any route sees them: what a web page of another origin could otherwise make a browser send.

- **Host** (DNS rebinding): a page whose name an attacker points at this machine reaches the server as a
  same-origin page of that name, so the browser lets it read every answer. Its requests carry that name in `Host`,
  so a request naming a host this server does not answer to is refused with 400. Always accepted: `localhost`,
  any IP address (a page reached by its address is this server's own page: no name was rebound), the `host`
  setting when it is a name, and with `host` 0.0.0.0 or :: the machine's host name; `allowed_hosts` adds names.
  Ports are not compared: the port a client reached is the server's. A request without `Host` (HTTP/1.0) is not a
  browser's and passes. Starlette's TrustedHostMiddleware is not used: it cannot accept IP addresses as a class
  and answers in plain text where every other error here is JSON.
- **Origin** (cross-site request forgery): every method but GET, HEAD and OPTIONS, and every WebSocket handshake,
  is refused with 403 when a browser says it comes from a page of another origin: its `Origin` is not this
  server's own (the request's scheme with its `Host`) nor in `allowed_origins`; or it sends no `Origin` and its
  `Sec-Fetch-Site` is cross-site or same-site. Clients that are not browsers send neither and pass. A page of
  another origin can send a form POST or a no-cors fetch (an upload) without asking (no CORS preflight): this is
  what stops them.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from fastapi import status
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from invokeai.app.api.errors import ErrorResponse

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": 80, "https": 443}
# A WebSocket's page is an http(s) page: its handshake's scope says ws(s).
PAGE_SCHEMES = {"ws": "http", "wss": "https", "http": "http", "https": "https"}
WILDCARD_ADDRESSES = ("0.0.0.0", "::")
ALWAYS_ALLOWED_NAMES = ("localhost",)
# A WebSocket closed before it is accepted is answered with HTTP 403 (ASGI); 1008 is "policy violation".
POLICY_VIOLATION = 1008

Origin = tuple[str, str, int]  # scheme, host, port: what makes two pages the same origin


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def split_host(header: str) -> tuple[str, int | None] | None:
    """The host (lower-case, brackets and a final dot removed) and port of a Host header, or None if it is not
    one."""
    try:
        parts = urlsplit(f"//{header}")
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, a bracket left open
        return None
    if not host or parts.path or parts.query or parts.fragment or "@" in header:
        return None
    return host.rstrip("."), port


def parse_origin(text: str) -> Origin | None:
    """An http(s) origin (`scheme://host[:port]`) as (scheme, host, port), or None: `null` (a sandboxed frame, a
    file: page) and anything else that names no origin."""
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not host or parts.path not in ("", "/") or parts.query or "@" in parts.netloc:
        return None
    return scheme, host.rstrip("."), port or DEFAULT_PORTS[scheme]


def origin_text(origin: Origin) -> str:
    """An origin as browsers write it in `Origin`: the default port left out."""
    scheme, host, port = origin
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" if port == DEFAULT_PORTS[scheme] else f"{scheme}://{host}:{port}"


def own_origin(scheme: str, host_header: str | None) -> Origin | None:
    """The origin of this server as the request reached it: its scheme and Host."""
    page_scheme = PAGE_SCHEMES.get(scheme)
    if page_scheme is None or not host_header:
        return None
    return parse_origin(f"{page_scheme}://{host_header}")


class AllowedHosts:
    """The names that a request's Host header may carry (module docstring)."""

    def __init__(self, configured_host: str, listed: Sequence[str]) -> None:
        host = configured_host.strip("[]").lower()
        names = set(ALWAYS_ALLOWED_NAMES)
        if host in WILDCARD_ADDRESSES:
            # Serving every interface: clients on the network may know the machine by its host name.
            names.add(socket.gethostname().lower())
        elif not is_ip_address(host):
            names.add(host.rstrip("."))
        self.any = "*" in listed
        self.names = frozenset(names | {name for name in listed if not name.startswith("*")})
        # "*.example.com" -> ".example.com": subdomains only, as Starlette's TrustedHostMiddleware reads it.
        self.suffixes = tuple(name[1:] for name in listed if name.startswith("*."))

    def allows(self, host: str) -> bool:
        return self.any or is_ip_address(host) or host in self.names or host.endswith(self.suffixes)


class AllowedOrigins:
    """The origins whose pages may change something: the server's own, as each request reached it, and those of
    the allowed_origins setting."""

    def __init__(self, listed: Iterable[str]) -> None:
        self.listed = frozenset(origin for origin in map(parse_origin, listed) if origin is not None)

    def allows(self, origin_header: str, scheme: str, host_header: str | None) -> bool:
        origin = parse_origin(origin_header)
        return origin is not None and (origin in self.listed or origin == own_origin(scheme, host_header))

    def refusal(self, headers: Headers, scheme: str) -> str | None:
        """Why a browser's request that would change something must be refused, or None."""
        origin = headers.get("origin")
        if origin is not None:
            if self.allows(origin, scheme, headers.get("host")):
                return None
            return (
                f"a page of another origin ({origin}) may not change anything on this server; "
                "the allowed_origins setting lists the origins that may"
            )
        site = headers.get("sec-fetch-site", "").lower()
        if site in ("cross-site", "same-site"):
            return (
                f"a page of another origin (Sec-Fetch-Site: {site}) may not change anything on this server; "
                "the allowed_origins setting lists the origins that may"
            )
        return None


class RequestGuard:
    """The refusals of the module docstring, as an ASGI middleware in front of everything (the Socket.IO mount
    included)."""

    def __init__(self, app: ASGIApp, *, hosts: AllowedHosts, origins: AllowedOrigins) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refused = self._refusal(scope)
        if refused is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": POLICY_VIOLATION, "reason": refused[1][:120]})
        else:
            await ErrorResponse({"detail": refused[1]}, status_code=refused[0])(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = Headers(scope=scope)
        host_header = headers.get("host")
        if host_header is not None and not self.hosts.allows((split_host(host_header) or ("",))[0]):
            return (
                status.HTTP_400_BAD_REQUEST,
                f"this server does not answer to the host {host_header!r} (the Host header); the allowed_hosts "
                "setting lists the names it answers to besides localhost and its IP addresses",
            )
        if scope["type"] == "websocket" or scope["method"] not in SAFE_METHODS:
            why = self.origins.refusal(headers, scope["scheme"])
            if why is not None:
                return status.HTTP_403_FORBIDDEN, why
        return None
