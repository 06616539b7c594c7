"""A butler's MCP server: its tools, over streamable HTTP (``/mcp``) and SSE (``/sse``).

Core tools every butler has: ``state_get``, ``state_set``, ``state_list`` (a
key-value store per butler), ``schedule_list``, ``sessions_list`` and
``trigger`` (start a new run of this same butler; such a run has trigger source
``trigger`` and is refused at once, not queued, when no slot is free). A caller
that sends ``trigger`` a progress token gets one MCP progress notification per
tool call, text chunk and usage update of the run while it happens, in order,
before the result (:func:`progress_message` says what each carries).

Only callers with a live secret get in (:mod:`spawnkit.containment.mcp_guard` checks Host,
Origin and ``Authorization: Bearer`` before any MCP code runs): each run's own
secret, minted by the spawner through the server's :class:`~spawnkit.containment.mcp_access.
AccessTable`, and the owner token of a served butler. A server middleware
records each ``tools/call`` in the store's ``mcp_calls`` table against the
session key the caller's secret was granted for, so the server's view of a run
can be joined with the runtime's; the run's secrets are redacted there as
everywhere else (:mod:`spawnkit.redaction`). A URL naming another session is
refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from croniter import croniter
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel

from .. import _asgi
from ..config.roster import ButlerConfig
from ..containment.mcp_access import AccessTable, Caller
from ..containment.mcp_guard import (
    CALLER_SCOPE_KEY,
    MCP_PATH,
    MESSAGE_PATH,
    SSE_PATH,
    McpGuard,
    host_names,
)
from ..errors import InvalidArgument, TriggerRejected
from ..events import AssistantText, RunEvent, ToolCallFinished, ToolCallStarted, UsageUpdate
from ..redaction import Redactor
from ..store import SessionStore

if TYPE_CHECKING:
    from ..run import Spawner

logger = logging.getLogger(__name__)

# Adds tools to a butler's server (for example the notebook's kernel tools).
ToolExtension = Callable[[MCPServer[Any]], None]

# Progress notifications a run may have waiting for a slow MCP client; past this
# the oldest text chunks are not sent (tool calls and usage always are).
PROGRESS_QUEUE_LIMIT = 1000
PROGRESS_TEXT_LIMIT = 2000


def progress_message(event: RunEvent) -> str | None:
    """The JSON message of the progress notification for ``event``, or None (not reported).

    ``{"event": "tool_call", "id", "tool", "server", "status", "input"}`` when a tool
    call starts (status ``running``) and again when it ends (``ok`` or ``error``);
    ``{"event": "text", "text"}`` for each chunk of the agent's text (at most
    :data:`PROGRESS_TEXT_LIMIT` characters); ``{"event": "usage", "input_tokens",
    "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd"}`` with the
    running totals. Events reach here already redacted by the spawner.
    """
    body: dict[str, Any]
    if isinstance(event, ToolCallStarted | ToolCallFinished):
        call = event.call
        body = {
            "event": "tool_call",
            "id": call.id,
            "tool": call.tool or call.name,
            "server": call.server,
            "status": call.status,
            "input": call.input,
        }
    elif isinstance(event, AssistantText):
        body = {"event": "text", "text": event.text[:PROGRESS_TEXT_LIMIT]}
    elif isinstance(event, UsageUpdate):
        u = event.usage
        body = {
            "event": "usage",
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cache_read_tokens": u.cache_read_tokens,
            "cache_write_tokens": u.cache_write_tokens,
            "cost_usd": event.cost_usd,
        }
    else:
        return None
    return json.dumps(body, default=str)


class _ProgressRelay:
    """Sends a run's events to one MCP caller as progress notifications, in order.

    The spawner calls :meth:`__call__` synchronously from the run; a task drains a
    bounded queue into ``ctx.report_progress`` so a slow client never stalls the run.
    """

    def __init__(self, ctx: Context[Any, Any]) -> None:
        self._ctx = ctx
        self._queue: asyncio.Queue[str | None] = asyncio.Queue(PROGRESS_QUEUE_LIMIT)
        self._sent = 0
        self._dropped = 0
        self._task = asyncio.create_task(self._pump())

    def __call__(self, event: RunEvent) -> None:
        message = progress_message(event)
        if message is None:
            return
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            self._dropped += 1

    async def _pump(self) -> None:
        while (message := await self._queue.get()) is not None:
            self._sent += 1
            await self._ctx.report_progress(self._sent, None, message)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (bounded by ``timeout_s``), then stop."""
        await self._queue.put(None)
        try:
            await asyncio.wait_for(self._task, timeout_s)
        except TimeoutError:
            logger.warning("gave up sending progress to a slow MCP client")
        except Exception:
            logger.exception("could not send progress to the MCP client")
        if self._dropped:
            logger.warning("a slow MCP client missed %d progress notifications", self._dropped)


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
        async def trigger(
            prompt: str, ctx: Context[Any, Any], context: str | None = None
        ) -> dict[str, Any]:
            """Start a new run of this butler with ``prompt`` and wait for its result.

            Asked for progress, each tool call, text chunk and usage update of
            the run arrives first as a progress notification (a JSON message).
            """
            if self.spawner is None:
                return {"success": False, "error": "this server has no spawner to trigger runs"}
            relay = _ProgressRelay(ctx) if _has_request(ctx) else None
            try:
                result = await self.spawner.trigger(
                    prompt, "trigger", context=context, on_event=relay
                )
            except (TriggerRejected, InvalidArgument) as exc:
                return {"success": False, "error": str(exc)}
            finally:
                if relay is not None:
                    await relay.close()
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


def _has_request(ctx: Context[Any, Any]) -> bool:
    """Whether this call answers a request, the only place progress can go.

    A tool called in process (``mcp.call_tool(name, arguments)``, as MCP servers are
    tested) has a Context without one. With a request, the SDK's ``report_progress``
    sends to the caller's progress token or callback, and is a no-op when it asked for none.
    """
    try:
        ctx.request_context  # noqa: B018  (raises outside of a request)
    except ValueError:  # "Context is not available outside of a request"
        return False
    return True


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
