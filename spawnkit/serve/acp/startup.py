"""The butler's service, started beside the protocol instead of before it.

Starting a butler's service (its replay server, MCP server and spans) takes seconds on a
loaded machine, and an ACP client waits for ``initialize`` before it shows the agent at
all. So ``spawnkit acp`` answers ``initialize`` at once and starts the service in a task
of its own (:class:`ServiceStartup`); only what needs the service (a prompt) waits for
it. A service that fails to start, or does not start within :data:`START_TIMEOUT_S`,
makes each request that needs it a JSON-RPC error saying why, and the agent goes on
answering the rest (``session/load`` reads the store, not the service).

The service's context is entered and left in that one task: its servers' task groups
must be left by the task that entered them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from acp import RequestError

from ...errors import SpawnkitError

if TYPE_CHECKING:  # its modules load in the service's own start, in a thread
    from ..service import ButlerService

logger = logging.getLogger(__name__)

# A hang guard: a service that has not started by then never will.
START_TIMEOUT_S = 300.0

ServiceContext = Callable[[], AbstractAsyncContextManager["ButlerService"]]


class ServiceStartup:
    """Starts a butler's service in the background and hands it to whoever needs it.

    ``start()`` is the service's context (``serving(...)``), entered once, left by
    :meth:`close`. Create it on the running event loop.
    """

    def __init__(self, start: ServiceContext, *, butler: str) -> None:
        self.butler = butler
        self.service: ButlerService | None = None
        self.error: str | None = None
        self._ended = asyncio.Event()  # started, or failed to
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._serve(start), name=f"acp-service:{butler}")

    async def ready(self) -> ButlerService:
        """The running service; a JSON-RPC error when it could not start."""
        await self._ended.wait()
        self.raise_if_failed()
        assert self.service is not None  # set before _ended, when there is no error
        return self.service

    def raise_if_failed(self) -> None:
        """Raise the start's failure now, if it has already failed (no waiting)."""
        if self.error is not None:
            raise RequestError.internal_error({"details": self.error})

    async def close(self) -> None:
        """Stop the service (cancelling its start, if still under way)."""
        self._stop.set()
        if not self._ended.is_set():
            self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise

    async def _serve(self, start: ServiceContext) -> None:
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                context = start()
                service = await context.__aenter__()
        except TimeoutError:
            self._failed(f"it did not start within {START_TIMEOUT_S:.0f} s")
            return
        except asyncio.CancelledError:
            self._failed("it was stopped before it started")  # the agent is closing
            raise
        except Exception as exc:
            # Bad configuration is a SpawnkitError with its own message; anything else
            # is a bug, whose traceback goes to the agent's log (stderr).
            if not isinstance(exc, SpawnkitError):
                logger.exception("the service of butler %s failed to start", self.butler)
            self._failed(str(exc) or type(exc).__name__)
            return
        self.service = service
        self._ended.set()
        try:
            await self._stop.wait()
        finally:
            await context.__aexit__(None, None, None)

    def _failed(self, why: str) -> None:
        self.error = f"the service of butler {self.butler} could not start: {why}"
        logger.error("%s", self.error)
        self._ended.set()
