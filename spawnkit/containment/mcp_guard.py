"""The ASGI layer in front of a butler's MCP server: who may send what, checked first.

Every HTTP request passes three checks before any MCP code sees it:

1. ``Host`` must be a loopback name (or the address the server was bound to) and
   ``Origin``, when sent, must match it (DNS-rebinding protection; refused with
   421 and 403);
2. ``Authorization: Bearer <secret>`` must prove a live caller in the
   :class:`~spawnkit.containment.mcp_access.AccessTable` (else 401);
3. what the request names must belong to that caller: the ``session_id`` in an
   ``/mcp`` or ``/sse`` URL must be the caller's own session key, and a transport
   session (the SSE connection a ``/messages/`` POST names, the ``mcp-session-id``
   header of streamable HTTP) must have been opened by the same caller (else 403,
   or 404 for one the server never issued).

A refused request reaches nothing: no tool runs, no state changes, nothing is
recorded. An accepted one carries its :class:`~spawnkit.containment.mcp_access.Caller` in the
ASGI scope (:data:`CALLER_SCOPE_KEY`), which is what the server records calls
against. The owner (token file) may also mint and withdraw run secrets at
:data:`~spawnkit.containment.mcp_access.GRANTS_PATH`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from starlette.responses import JSONResponse, Response

from .mcp_access import GRANTS_PATH, AccessTable, Caller

logger = logging.getLogger(__name__)

CALLER_SCOPE_KEY = "spawnkit.caller"
SESSION_PARAM = "session_id"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
MCP_PATH, SSE_PATH, MESSAGE_PATH = "/mcp", "/sse", "/messages/"
MAX_GRANT_TTL_S = 7 * 24 * 3600.0
_MAX_GRANT_BODY = 8192
_SSE_ID_RE = re.compile(rb"session_id=([0-9a-fA-F-]{8,64})")

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


def host_names(bound_host: str | None) -> tuple[str, ...]:
    """Host names a request may use: loopback, plus the bound address if it is specific."""
    names = list(LOOPBACK_NAMES)
    if bound_host and bound_host not in ("0.0.0.0", "::", ""):
        name = f"[{bound_host}]" if ":" in bound_host else bound_host
        if name not in names:
            names.append(name)
    return tuple(names)


def _header(scope: _Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def _query(scope: _Scope, name: str) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return values[0] if values else None


def _host_allowed(host: str | None, names: Iterable[str]) -> bool:
    if not host:
        return False
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name.lower() in names


def _origin_allowed(origin: str | None, names: Iterable[str]) -> bool:
    if origin is None:
        return True  # not a browser, or a same-origin request
    scheme, sep, rest = origin.partition("://")
    return sep != "" and scheme.lower() == "http" and _host_allowed(rest.rstrip("/"), names)


class McpGuard:
    """Wraps an MCP server's ASGI app with the checks described in the module docstring."""

    def __init__(self, app: ASGIApp, access: AccessTable, hosts: Iterable[str]) -> None:
        self.app = app
        self.access = access
        self.hosts = tuple(h.lower() for h in hosts)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await Response("only HTTP is served here", 403)(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        caller = scope[CALLER_SCOPE_KEY]
        path = scope.get("path", "")
        if path == GRANTS_PATH:
            await self._grants(caller, scope, receive, send)
            return
        await self.app(scope, receive, self._binding_send(caller, path, scope, send))

    def _refusal(self, scope: _Scope) -> Response | None:
        """The response refusing this request, or None (and the caller in the scope)."""
        if not _host_allowed(_header(scope, b"host"), self.hosts):
            return Response("Invalid Host header", 421)
        if not _origin_allowed(_header(scope, b"origin"), self.hosts):
            return Response("Invalid Origin header", 403)
        path, method = scope.get("path", ""), scope.get("method", "")
        caller = self.access.authenticate(_header(scope, b"authorization"))
        if caller is None:
            client = scope.get("client") or ("?", 0)
            logger.warning("refused %s %s from %s: no valid bearer secret", method, path, client[0])
            return Response(
                "unauthorized: this MCP server needs its run's bearer secret",
                401, headers={"WWW-Authenticate": 'Bearer realm="spawnkit"'},
            )  # fmt: skip
        if path in (MCP_PATH, SSE_PATH) or path.startswith(MCP_PATH + "/"):
            named = _query(scope, SESSION_PARAM)
            if named is not None and named != caller.session_key:
                logger.warning("refused %s %s: its URL names another session", method, path)
                return Response("forbidden: the session id in the URL is not this caller's", 403)
            transport = _header(scope, b"mcp-session-id")
            if transport is not None and (refused := self._foreign(transport, caller)):
                return refused
        elif path == MESSAGE_PATH.rstrip("/") or path.startswith(MESSAGE_PATH):
            # The SDK mounts the message endpoint: any path below it reaches it.
            transport = _query(scope, SESSION_PARAM)
            if transport is not None and (refused := self._foreign(transport, caller)):
                return refused
        elif path == GRANTS_PATH and not caller.is_owner:
            return Response("forbidden: only the owner token may grant run secrets", 403)
        scope[CALLER_SCOPE_KEY] = caller
        return None

    def _foreign(self, transport_id: str, caller: Caller) -> Response | None:
        opener = self.access.bound_to(transport_id)
        if opener is None:
            return Response("no such MCP session", 404)
        if opener != caller.grant_id:
            logger.warning("refused a request on an MCP session another caller opened")
            return Response("forbidden: this MCP session belongs to another caller", 403)
        return None

    def _binding_send(self, caller: Caller, path: str, scope: _Scope, send: _Send) -> _Send:
        """``send``, tying the transport session ids the server hands out to ``caller``."""
        sse_stream = path == SSE_PATH and scope.get("method") == "GET"
        seen: list[bool] = []

        async def watch(message: _Message) -> None:
            if message.get("type") == "http.response.start":
                for key, value in message.get("headers", ()):
                    if key.lower() == b"mcp-session-id":
                        self.access.bind(value.decode("latin-1"), caller)
            elif sse_stream and not seen and message.get("type") == "http.response.body":
                # The stream's first event announces "/messages/?session_id=<hex>";
                # it is bound before the client can read it.
                found = _SSE_ID_RE.search(message.get("body", b""))
                if found:
                    seen.append(True)
                    self.access.bind(found.group(1).decode(), caller)
            await send(message)

        return watch

    async def _grants(self, caller: Caller, scope: _Scope, receive: _Receive, send: _Send) -> None:
        """``POST {session_key, ttl_s}`` mints a run secret; ``DELETE {secret}`` withdraws one."""
        method = scope.get("method")
        if method not in ("POST", "DELETE"):
            await Response("use POST or DELETE", 405)(scope, receive, send)
            return
        body = await _read_body(receive, _MAX_GRANT_BODY)
        try:
            data = json.loads(body) if body is not None else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            await Response("expected a JSON object of at most 8 KiB", 400)(scope, receive, send)
            return
        if method == "DELETE":
            secret = data.get("secret")
            if isinstance(secret, str):
                self.access.remove(secret)
            await Response(status_code=204)(scope, receive, send)
            return
        key, ttl = data.get("session_key"), data.get("ttl_s")
        if not isinstance(key, str) or not 0 < len(key) <= 256:
            await Response("session_key must be a non-empty string", 400)(scope, receive, send)
            return
        if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl <= 0:
            ttl = MAX_GRANT_TTL_S
        secret = await self.access.grant(key, min(float(ttl), MAX_GRANT_TTL_S))
        await JSONResponse({"secret": secret}, 201)(scope, receive, send)


async def _read_body(receive: _Receive, limit: int) -> bytes | None:
    """The request body, or None when it is longer than ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
