"""A butler's MCP server: its tools, over streamable HTTP (``/mcp``) and SSE (``/sse``).

Core tools every butler has: ``state_get``, ``state_set``, ``state_list`` (a
key-value store per butler), ``schedule_list``, ``sessions_list`` and
``trigger`` (start a new run of this same butler; such a run has trigger source
``trigger`` and is refused at once, not queued, when no slot is free).

Every run reaches the server with its session key in the URL
(``/mcp?session_id=...``). A server middleware records each ``tools/call``
against that session in the store's ``mcp_calls`` table, so the server's view
of a run can be joined with the runtime's; the run's secrets are redacted there
as everywhere else (:mod:`spawnkit.redaction`). On SSE the key rides only the
``GET /sse`` URL; the server remembers which SSE connection carries which key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from croniter import croniter
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from . import _asgi
from .errors import TriggerRejected
from .redaction import Redactor
from .roster import ButlerConfig
from .store import SessionStore

if TYPE_CHECKING:
    from .spawner import Spawner

logger = logging.getLogger(__name__)

SESSION_PARAM = "session_id"
# Adds tools to a butler's server (for example the notebook's kernel tools).
ToolExtension = Callable[[MCPServer[Any]], None]
_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _session_param(query: str) -> str | None:
    values = parse_qs(query).get(SESSION_PARAM)
    return values[0] if values else None


class _SseSessions:
    """Maps the SSE transport's own connection id to the session key of its GET URL."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    def endpoint(self, original: Callable[[Request], Awaitable[Any]]) -> _SseEndpoint:
        return _SseEndpoint(self, original)


class _SseEndpoint:
    """The ``GET /sse`` ASGI endpoint, watching the stream for the connection's id."""

    def __init__(self, sessions: _SseSessions, original: Callable[[Request], Awaitable[Any]]):
        self.sessions = sessions
        self.original = original

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        key = _session_param(scope.get("query_string", b"").decode())
        seen: list[str] = []

        async def watch(message: MutableMapping[str, Any]) -> None:
            # The stream's first event announces "/messages/?session_id=<hex>".
            if key and not seen and message.get("type") == "http.response.body":
                body = message.get("body", b"").decode(errors="replace")
                if "session_id=" in body:
                    seen.append(body.split("session_id=", 1)[1].split()[0].strip())
                    self.sessions.keys[seen[0]] = key
            await send(message)

        try:
            # The SDK's endpoint streams through the request's send and returns
            # an empty Response only after the stream is over; it is not sent.
            await self.original(Request(scope, receive, watch))
        finally:
            for hex_id in seen:
                self.sessions.keys.pop(hex_id, None)


class ButlerServer:
    """The MCP server of one butler."""

    def __init__(
        self,
        butler: ButlerConfig,
        store: SessionStore,
        spawner: Spawner | None = None,
        extensions: Sequence[ToolExtension] = (),
    ) -> None:
        self.butler = butler
        self.store = store
        self.spawner = spawner
        self._sse = _SseSessions()
        self.mcp = self._build_mcp()
        for extend in extensions:
            extend(self.mcp)

    # -- recording -------------------------------------------------------------

    def _session_key(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        request = ctx.request
        url = getattr(request, "url", None)
        if url is None:
            return None
        key = _session_param(url.query)
        if url.path.rstrip("/").endswith("/messages") and key is not None:
            return self._sse.keys.get(key)  # the SSE transport's id, not ours
        return key

    async def _record_calls(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params = dict(ctx.params or {})
        tool = str(params.get("name", "?"))
        arguments = params.get("arguments") or {}
        key = self._session_key(ctx)
        called_at = datetime.now(UTC)
        clock = time.monotonic()
        is_error, text = True, ""
        try:
            result = await call_next(ctx)
            payload = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
            payload = payload or {}
            is_error = bool(payload.get("isError"))
            text = "\n".join(
                str(block.get("text", ""))
                for block in payload.get("content", [])
                if isinstance(block, dict)
            )
            return result
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            duration = int((time.monotonic() - clock) * 1000)
            try:
                # The run's secrets stay out of the row (redacted before the cut).
                redact = self.spawner.redactor_for(key) if self.spawner else Redactor()
                await asyncio.to_thread(
                    self.store.record_mcp_call,
                    butler=self.butler.name,
                    session_key=key,
                    tool=tool,
                    arguments=redact.data(arguments),
                    result=redact.text(text)[:16_384],
                    is_error=is_error,
                    called_at=called_at,
                    duration_ms=duration,
                )
            except Exception:
                logger.exception("could not record the %s call of session %s", tool, key)

    # -- tools -----------------------------------------------------------------

    def _build_mcp(self) -> MCPServer[Any]:
        butler, store = self.butler.name, self.store
        with _quiet_mcp_logging():
            mcp: MCPServer[Any] = MCPServer(
                butler,
                instructions=self.butler.description or None,
                log_level="WARNING",
                middleware=[self._record_calls],
            )

        @mcp.tool()
        async def state_get(key: str) -> dict[str, Any]:
            """Read the value stored under ``key``; ``found`` is false when there is none."""
            found, value = await asyncio.to_thread(store.state_lookup, butler, key)
            return {"key": key, "found": found, "value": value}

        @mcp.tool()
        async def state_set(key: str, value: Any) -> str:
            """Store any JSON value under ``key``, replacing what was there."""
            await asyncio.to_thread(store.state_set, butler, key, value)
            return f"stored {key}"

        @mcp.tool()
        async def state_list(prefix: str = "") -> dict[str, Any]:
            """All stored keys starting with ``prefix``, with their values."""
            return await asyncio.to_thread(store.state_list, butler, prefix)

        @mcp.tool()
        async def schedule_list() -> list[dict[str, Any]]:
            """This butler's scheduled tasks and when each fires next (UTC)."""
            now = datetime.now(UTC)
            return [
                {
                    "name": s.name,
                    "cron": s.cron,
                    "prompt": s.prompt,
                    "next_run": croniter(s.cron, now).get_next(datetime).isoformat(),
                }
                for s in self.butler.schedules
            ]

        @mcp.tool()
        async def sessions_list(limit: int = 10, status: str | None = None) -> list[dict[str, Any]]:
            """This butler's most recent runs, newest first."""
            records = await asyncio.to_thread(
                store.list_sessions, butler=butler, status=status, limit=max(1, min(limit, 100))
            )
            return [
                {
                    "id": r.id,
                    "status": r.status,
                    "trigger_source": r.trigger_source,
                    "prompt": r.prompt[:200],
                    "created_at": r.created_at.isoformat(),
                    "duration_ms": r.duration_ms,
                    "cost_usd": r.cost_usd,
                    "error": r.error,
                }
                for r in records
            ]

        @mcp.tool()
        async def trigger(prompt: str, context: str | None = None) -> dict[str, Any]:
            """Start a new run of this butler with ``prompt`` and wait for its result."""
            if self.spawner is None:
                return {"success": False, "error": "this server has no spawner to trigger runs"}
            try:
                result = await self.spawner.trigger(prompt, context, trigger_source="trigger")
            except TriggerRejected as exc:
                return {"success": False, "error": str(exc)}
            return result.to_dict()

        return mcp

    # -- serving -----------------------------------------------------------------

    def app(self) -> Starlette:
        """One ASGI app serving streamable HTTP at ``/mcp`` and SSE at ``/sse``."""
        app = self.mcp.streamable_http_app(streamable_http_path="/mcp")
        sse = self.mcp.sse_app(sse_path="/sse", message_path="/messages/")
        for route in sse.routes:
            if isinstance(route, Route) and route.path == "/sse":
                route = Route("/sse", endpoint=self._sse.endpoint(route.endpoint), methods=["GET"])
            app.router.routes.append(route)
        return app

    @asynccontextmanager
    async def serve(
        self, host: str = "127.0.0.1", port: int | None = None
    ) -> AsyncIterator[_asgi.ServerAddress]:
        """Serve on ``port`` (the butler's own by default; 0 picks a free one)."""
        async with _asgi.serve(
            self.app(), host, self.butler.port if port is None else port
        ) as address:
            yield address


class _quiet_mcp_logging:
    """MCPServer() calls logging.basicConfig(); a library must not configure the root logger."""

    def __enter__(self) -> None:
        self._root = logging.getLogger()
        self._added = None
        if not self._root.handlers:
            self._added = logging.NullHandler()
            self._root.addHandler(self._added)

    def __exit__(self, *exc: object) -> None:
        if self._added is not None:
            self._root.removeHandler(self._added)
