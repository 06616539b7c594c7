"""A serving butler: its spawner, its MCP server and its schedule, started together.

:class:`ButlerService` is what ``spawnkit serve``, ``spawnkit run`` and the
notebook frontends use. It can also start the replay model server and point
the runtime at it, so the same code runs offline on scripted turns or, without
a scenario, on the real model API::

    async with ButlerService(butler, replay=Scenario.load(path)) as service:
        result = await service.trigger("I weighed 72.4 kg")

Unless ``external_mcp`` is set, the MCP server runs in-process on a free port
(``mcp_port=None``) or a given one, and the spawner grants each run's secret
in the server's own access table. With ``external_mcp`` the runs use the butler
served on its configured port (``spawnkit serve``), which grants their secrets
when asked with its owner token. ``owner_token=True`` (``spawnkit serve``)
creates that token file, so the user's own MCP clients can call the butler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from opentelemetry.trace import TracerProvider

from ..config.roster import ButlerConfig
from ..containment.credentials import CredentialStore
from ..containment.mcp_access import AccessTable, RemoteAccess, owner_token, owner_token_path
from ..errors import SpawnkitError
from ..replay import ReplayServer, Scenario
from ..result import SpawnerResult
from ..run import Spawner
from ..store import SessionStore
from .butler_server import ButlerServer, ToolExtension
from .scheduler import Scheduler

logger = logging.getLogger(__name__)

# The key a replayed run presents to the local replay server; never a real one.
REPLAY_API_KEY = "spawnkit-replay"
REPLAY_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY")


class _OverlayCredentials(CredentialStore):
    """Credentials with a few fixed values on top (the replay key)."""

    def __init__(self, base: CredentialStore, overrides: dict[str, str]) -> None:
        super().__init__(base.store, base.environ, file=base.file)
        self.base = base
        self.overrides = overrides

    def resolve(self, name: str) -> str | None:
        if name in self.overrides:
            return self.overrides[name]
        return self.base.resolve(name)


class ButlerService:
    """Runs one butler: spawner + MCP server (+ replay server, + schedule)."""

    def __init__(
        self,
        butler: ButlerConfig,
        *,
        store: SessionStore | None = None,
        replay: Scenario | ReplayServer | Path | str | None = None,
        external_mcp: bool = False,
        mcp_port: int | None = None,
        mcp_host: str = "127.0.0.1",
        schedules: bool = False,
        tracer_provider: TracerProvider | None = None,
        tool_extensions: Sequence[ToolExtension] = (),
        owner_token: bool = False,
        access: AccessTable | None = None,
        **spawner_options: Any,
    ) -> None:
        self.butler = butler
        self.store = store if store is not None else SessionStore()
        if isinstance(replay, str | Path):
            replay = Scenario.load(replay)
        # A ReplayServer of the caller's (one with a Throttle, say) is served as it is.
        self.replay_server: ReplayServer | None = None
        if isinstance(replay, ReplayServer):
            self.replay_server, replay = replay, replay.scenario
        self.scenario = replay
        self.external_mcp = external_mcp
        self.mcp_port = mcp_port
        self.mcp_host = mcp_host
        self.run_schedules = schedules
        self.tracer_provider = tracer_provider
        self.tool_extensions = tool_extensions
        self.spawner_options = spawner_options
        self.owner_token = owner_token
        # The secrets the in-process MCP server accepts (a fresh table by default).
        self.access = access if access is not None else AccessTable()
        # The owner token's file, when this service serves one (owner_token=True).
        self.token_file: Path | None = None
        self.replay_url: str | None = None
        self.mcp_url: str | None = None
        self._spawner: Spawner | None = None
        self.scheduler: Scheduler | None = None
        self._stack: AsyncExitStack | None = None

    @property
    def spawner(self) -> Spawner:
        if self._spawner is None:
            raise SpawnkitError("the service is not running; use `async with ButlerService(...)`")
        return self._spawner

    async def __aenter__(self) -> ButlerService:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await self._start(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _start(self, stack: AsyncExitStack) -> None:
        options = dict(self.spawner_options)
        cluster = options.get("cluster")
        if cluster is not None:
            # Runs happen on the cluster's workers, each with its own MCP and replay
            # servers (spawnkit.cluster.worker): nothing to serve here.
            if self.scenario is not None and cluster.replay is None:
                cluster.replay = self.scenario
            self._spawner = Spawner(
                self.butler, store=self.store, tracer_provider=self.tracer_provider, **options
            )
            stack.push_async_callback(self._drain, self._spawner)
            return
        if self.scenario is not None:
            if self.replay_server is None:
                self.replay_server = ReplayServer(self.scenario)
            self.replay_url = await stack.enter_async_context(self.replay_server.serve())
            options["base_url"] = self.replay_url
            credentials = options.pop("credentials", None) or CredentialStore(self.store)
            options["credentials"] = _OverlayCredentials(
                credentials, dict.fromkeys(REPLAY_KEYS, REPLAY_API_KEY)
            )
        access = self.access
        if self.external_mcp:
            port = self.mcp_port or self.butler.port
            token = owner_token(owner_token_path(self.butler.name, port), create=False)
            options["mcp_access"] = RemoteAccess(f"http://{self.mcp_host}:{port}", token)
        else:
            options["mcp_access"] = access
        spawner = Spawner(
            self.butler, store=self.store, tracer_provider=self.tracer_provider, **options
        )
        if not self.external_mcp:
            server = ButlerServer(
                self.butler, self.store, spawner, self.tool_extensions, access=access
            )
            port = 0 if self.mcp_port is None else self.mcp_port
            address = await stack.enter_async_context(server.serve(self.mcp_host, port))
            spawner.mcp_port = address.port
            if self.owner_token:
                self.token_file = owner_token_path(self.butler.name, address.port)
                access.allow_owner(owner_token(self.token_file, create=True))
        self.mcp_url = f"http://{spawner.mcp_host}:{spawner.mcp_port or self.butler.port}"
        # Whatever else happens, no run outlives the service.
        stack.push_async_callback(self._drain, spawner)
        self._spawner = spawner
        if self.run_schedules and self.butler.schedules:
            self.scheduler = Scheduler(spawner)
            task = asyncio.create_task(self.scheduler.run(), name=f"scheduler:{self.butler.name}")
            stack.push_async_callback(_cancel, task)

    @staticmethod
    async def _drain(spawner: Spawner) -> None:
        spawner.stop_accepting()
        await spawner.drain(timeout=0)

    async def trigger(
        self, prompt: str, trigger_source: str = "external", **kwargs: Any
    ) -> SpawnerResult:
        """:meth:`Spawner.trigger <spawnkit.run.Spawner.trigger>` on this butler's spawner."""
        return await self.spawner.trigger(prompt, trigger_source, **kwargs)

    async def serve_forever(self) -> None:
        """Block until cancelled (Ctrl-C in ``spawnkit serve``)."""
        await asyncio.Event().wait()


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
