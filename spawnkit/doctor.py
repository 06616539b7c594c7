"""``spawnkit doctor``: is each agent CLI installed, and can a run reach its butler's MCP server?

Two kinds of checks, each a plain record the command line prints (or dumps as JSON):

* **Runtimes.** Each registered runtime's CLI is looked up the way a run looks it up; a
  missing one comes with the exact command that installs it (the version the tests pin).
  The ACP agents the roster's butlers name (``type = "acp"``) are looked up the same way.
* **MCP servers.** For each butler of the roster, its MCP server is started in-process
  on a free port, as ``spawnkit run`` does, and asked over its own transport for its
  tools: if that fails, no run of the butler can get its tools. The butler's configured
  port is probed too: ``--external-mcp`` runs and ``spawnkit serve`` need it, so
  something there that is not the butler's MCP server is a problem, and nothing there is
  reported (it only matters for ``--external-mcp``).
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import asdict, dataclass
from typing import Any

from .config.roster import ButlerConfig
from .errors import RuntimeNotFoundError
from .runtimes import available_runtimes, get_adapter

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RuntimeCheck:
    runtime: str
    found: bool
    path: str | None = None
    version: str | None = None
    install: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class McpCheck:
    """One butler's MCP server: does it answer in-process, and what serves its own port?"""

    butler: str
    transport: str
    ok: bool
    tools: tuple[str, ...] = ()
    error: str | None = None
    port: int = 0
    # "free", "serving" (the butler's MCP server answers there) or "other" (something else).
    port_status: str = "free"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tools": list(self.tools)}


def check_runtimes() -> list[RuntimeCheck]:
    """Each runtime's CLI: found where, at which version (each version check is bounded)."""
    checks = []
    for runtime in available_runtimes():
        if get_adapter(runtime).needs_configuration:
            continue  # no CLI of its own: each butler names one
        adapter = get_adapter(runtime)()
        try:
            path = adapter.find_binary()
        except RuntimeNotFoundError as exc:
            checks.append(RuntimeCheck(runtime, False, install=exc.install_hint))
            continue
        version = asyncio.run(adapter.binary_version())
        checks.append(RuntimeCheck(runtime, True, str(path), version))
    return checks


def check_acp_agents(butlers: list[ButlerConfig]) -> list[RuntimeCheck]:
    """The agent of each ``type = "acp"`` butler, as ``acp:<program>`` (each once)."""
    checks: dict[str, RuntimeCheck] = {}
    for butler in butlers:
        if butler.runtime.type != "acp" or not butler.runtime.acp_command:
            continue
        adapter = get_adapter("acp")(butler.runtime)
        name = f"acp:{butler.runtime.acp_command[0]}"
        if name in checks:
            continue
        try:
            path = adapter.find_binary()
        except RuntimeNotFoundError as exc:
            checks[name] = RuntimeCheck(name, False, install=exc.install_hint)
            continue
        checks[name] = RuntimeCheck(name, True, str(path), asyncio.run(adapter.binary_version()))
    return list(checks.values())


async def list_tools(
    url: str, transport: str, secret: str | None, timeout_s: float = PROBE_TIMEOUT_S
) -> list[str]:
    """The tool names an MCP server at ``url`` (``/mcp`` or ``/sse``) offers, within a timeout.

    ``secret`` is sent as a bearer token (a butler's server refuses calls without one).
    """
    from mcp import ClientSession
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    async with asyncio.timeout(timeout_s):
        if transport == "sse":
            async with (
                sse_client(url, headers=headers) as streams,
                ClientSession(streams[0], streams[1]) as session,
            ):
                await session.initialize()
                return [tool.name for tool in (await session.list_tools()).tools]
        http = create_mcp_http_client(headers=headers)
        async with (
            http,
            streamable_http_client(url, http_client=http) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            return [tool.name for tool in (await session.list_tools()).tools]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


async def check_mcp(butler: ButlerConfig) -> McpCheck:
    """Start ``butler``'s MCP server in-process, list its tools, then probe its own port."""
    import tempfile
    from pathlib import Path

    from .containment.mcp_access import AccessTable, owner_token, owner_token_path
    from .errors import SpawnkitError
    from .serve.butler_server import ButlerServer
    from .store import SessionStore

    path = butler.mcp_path
    tools: list[str] = []
    error: str | None = None
    # A scratch store: the probe's tools/list must not be recorded in the user's store.
    with tempfile.TemporaryDirectory(prefix="spawnkit-doctor-") as scratch:
        store = SessionStore(Path(scratch) / "sessions.db")
        access = AccessTable()
        try:
            secret = await access.grant("spawnkit-doctor")  # as a run would be granted
            async with ButlerServer(butler, store, access=access).serve("127.0.0.1", 0) as at:
                tools = await list_tools(f"{at.url}{path}", butler.mcp_transport, secret)
        except Exception as exc:  # noqa: BLE001 - any failure is the finding it reports
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        finally:
            store.close()
    port_status = "free"
    if butler.port and _listening(butler.port):
        try:  # `spawnkit serve` keeps an owner token for it
            token: str | None = owner_token(
                owner_token_path(butler.name, butler.port), create=False
            )
        except SpawnkitError:
            token = None
        try:
            served = await list_tools(
                f"http://127.0.0.1:{butler.port}{path}", butler.mcp_transport, token, 5.0
            )
        except Exception:  # noqa: BLE001 - not an MCP server there: that is the finding
            served = []
        port_status = "serving" if served and set(served) == set(tools) else "other"
    return McpCheck(
        butler.name, butler.mcp_transport, error is None and bool(tools), tuple(tools),
        error or (None if tools else "the server offered no tools"), butler.port, port_status,
    )  # fmt: skip


def check_roster_mcp(butlers: list[ButlerConfig]) -> list[McpCheck]:
    async def run() -> list[McpCheck]:
        return [await check_mcp(butler) for butler in butlers]

    return asyncio.run(run())
