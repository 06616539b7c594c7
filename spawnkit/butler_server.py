"""A butler's MCP server: its tools, over streamable HTTP (``/mcp``) and SSE (``/sse``).

Core tools every butler has: ``state_get``, ``state_set``, ``state_list`` (a
key-value store per butler), ``schedule_list``, ``sessions_list`` and
``trigger`` (start a new run of this same butler; such a run has trigger source
``trigger`` and is refused at once, not queued, when no slot is free).

Only callers with a live secret get in (:mod:`spawnkit.mcp_guard` checks Host,
Origin and ``Authorization: Bearer`` before any MCP code runs): each run's own
secret, minted by the spawner through the server's :class:`~spawnkit.mcp_access.
AccessTable`, and the owner token of a served butler. A server middleware
records each ``tools/call`` in the store's ``mcp_calls`` table against the
session key the caller's secret was granted for, so the server's view of a run
can be joined with the runtime's; the run's secrets are redacted there as
everywhere else (:mod:`spawnkit.redaction`). A URL naming another session is
refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from croniter import croniter
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel

from . import _asgi
from .errors import TriggerRejected
from .mcp_access import AccessTable, Caller
from .mcp_guard import CALLER_SCOPE_KEY, MCP_PATH, MESSAGE_PATH, SSE_PATH, McpGuard, host_names
from .redaction import Redactor
from .roster import ButlerConfig
from .store import SessionStore

if TYPE_CHECKING:
    from .spawner import Spawner

logger = logging.getLogger(__name__)

# Adds tools to a butler's server (for example the notebook's kernel tools).
ToolExtension = Callable[[MCPServer[Any]], None]


class ButlerServer:
    """The MCP server of one butler.

    ``access`` is the table of secrets it accepts; the spawner that starts this
    butler's runs must grant their secrets in the same table. By default the
    server uses its spawner's table (so ``ButlerServer(butler, store, spawner)``
    accepts exactly that spawner's runs), or a new one when there is no spawner.
    """

    def __init__(
        self,
        butler: ButlerConfig,
        store: SessionStore,
        spawner: Spawner | None = None,
        extensions: Sequence[ToolExtension] = (),
        access: AccessTable | None = None,
    ) -> None:
        self.butler = butler
        self.store = store
        self.spawner = spawner
        if access is None:
            own = spawner.mcp_access if spawner is not None else None
            access = own if isinstance(own, AccessTable) else AccessTable()
        self.access = access
        self.mcp = self._build_mcp()
        for extend in extensions:
            extend(self.mcp)

    # -- recording -------------------------------------------------------------

    @staticmethod
    def _caller(ctx: ServerRequestContext[Any, Any]) -> Caller | None:
        """Who sent this request, as the guard established from its secret."""
        scope = getattr(ctx.request, "scope", None)
        caller = scope.get(CALLER_SCOPE_KEY) if isinstance(scope, dict) else None
        return caller if isinstance(caller, Caller) else None

    async def _record_calls(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params = dict(ctx.params or {})
        tool = str(params.get("name", "?"))
        arguments = params.get("arguments") or {}
        caller = self._caller(ctx)
        key = caller.session_key if caller is not None else None
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
                result = await self.spawner.trigger(prompt, "trigger", context=context)
            except TriggerRejected as exc:
                return {"success": False, "error": str(exc)}
            return result.to_dict()

        return mcp

    # -- serving -----------------------------------------------------------------

    def app(self, host: str = "127.0.0.1") -> McpGuard:
        """One ASGI app serving streamable HTTP at ``/mcp`` and SSE at ``/sse``, guarded.

        ``host`` is the address the server is bound to: besides the loopback
        names, it is the only ``Host`` (and ``Origin``) a request may name.
        """
        names = host_names(host)
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[f"{name}:*" for name in names],
            allowed_origins=[f"http://{name}:*" for name in names],
        )
        app = self.mcp.streamable_http_app(
            streamable_http_path=MCP_PATH, transport_security=security
        )
        sse = self.mcp.sse_app(
            sse_path=SSE_PATH, message_path=MESSAGE_PATH, transport_security=security
        )
        app.router.routes.extend(sse.routes)
        return McpGuard(app, self.access, names)

    @asynccontextmanager
    async def serve(
        self, host: str = "127.0.0.1", port: int | None = None
    ) -> AsyncIterator[_asgi.ServerAddress]:
        """Serve on ``port`` (the butler's own by default; 0 picks a free one)."""
        async with _asgi.serve(
            self.app(host), host, self.butler.port if port is None else port
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
