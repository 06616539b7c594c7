"""The kernel's spawnkit hub: running butlers on the background loop, and their runs.

One :class:`Hub` per kernel keeps a :class:`~spawnkit.serve.service.ButlerService`
per target (a butler, possibly with its runtime, model or replay scenario
overridden), started on first use and kept for the kernel's lifetime, so
several runs of one butler share its semaphore, queue and MCP server. Every
run, blocking or background, is a :class:`RunHandle`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
from collections.abc import Generator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.limits import Limits
from ..config.roster import ButlerConfig
from ..events import EventSink, Finished, Queued, RunEvent, Started
from ..permissions import Approver
from ..result import SpawnerResult
from ..run import Spawner, SpawnerStatus
from ..run.dispatch import Cluster
from ..serve.butler_server import ToolExtension
from ..serve.queue_report import QueueReport, queue_report
from ..serve.service import ButlerService
from ..store import SessionStore
from .live import LiveStatus
from .loop import CANCEL_TIMEOUT_S, BackgroundLoop, Job, shared_loop

# A store's change feed is listening within this (else it goes on trying in the background).
FEED_START_TIMEOUT_S = 15.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """What a run runs on; equal targets share one service."""

    butler: ButlerConfig
    replay: Path | None = None
    model: str | None = None
    kernel_tools: bool = False
    # A Dask cluster the runs go to: a scheduler address, or "dask" with the user's client.
    on: str | None = None
    client: Any = field(default=None, compare=False)

    def key(self) -> tuple[Any, ...]:
        b = self.butler
        return (
            b.roster_dir,
            b.directory,
            b.name,
            b.runtime,
            self.replay,
            self.model,
            self.kernel_tools,
            self.on,
            id(self.client) if self.client is not None else None,
        )


class RunHandle:
    """A run started from a notebook: its status, its result, its view.

    ``result()`` blocks (an interrupt cancels the run), ``await handle`` works
    in a notebook cell, ``cancel()`` stops the run and records it as cancelled.
    """

    def __init__(self, hub: Hub, target: Target, view: Any | None = None, prompt: str = "") -> None:
        self.hub = hub
        self.target = target
        self.view = view
        self.prompt = prompt
        self.session_id: str | None = None
        self.state = "queued"
        self.position: int | None = None  # in the butler's queue, while queued
        self.result_value: SpawnerResult | None = None
        # The display of the live view, replaced by the finished view once the run ends.
        self.board: Any | None = None
        self.job: Job[SpawnerResult]

    def observe(self, event: RunEvent) -> None:
        if isinstance(event, Queued):
            self.session_id, self.state, self.position = event.session_id, "queued", event.position
        elif isinstance(event, Started):
            self.session_id, self.state, self.position = event.session_id, "running", None
        elif isinstance(event, Finished):
            self.state, self.position = event.result.status, None
            self.result_value = event.result

    @property
    def status(self) -> str:
        """queued, running, success, failed or cancelled."""
        if self.job.done() and self.job.future.cancelled():
            return "cancelled"
        return self.state

    def done(self) -> bool:
        return self.job.done()

    def result(self, timeout: float | None = None) -> SpawnerResult:
        try:
            result = self.job.future.result(timeout)
        except KeyboardInterrupt:
            self.cancel()
            raise
        self.show_finished()
        return result

    def __await__(self) -> Generator[Any, None, SpawnerResult]:
        result = yield from asyncio.wrap_future(self.job.future).__await__()
        self.show_finished()
        return result

    def show_finished(self) -> None:
        """Replace the live view's display with the finished one, from the caller's cell.

        The run's end already did so from the background loop, which reaches
        JupyterLab; from here it also reaches notebook runners (nbclient), which
        only take updates sent while a cell executes.
        """
        if self.board is not None and self.view is not None and self.job.done():
            self.board.update(self.view)

    def cancel(self, wait: bool = True) -> None:
        """Cancel the run (queued or running); by default wait until it is recorded.

        The run's ``result()`` is then a SpawnerResult with status ``cancelled``.
        """
        if self.job.done():
            return
        spawner = self.hub.spawner_for(self.target)
        if self.session_id is not None and spawner is not None:
            job = self.hub.loop.submit(spawner.cancel(self.session_id))
            if wait:
                job.future.result(CANCEL_TIMEOUT_S)
        else:
            self.job.cancel(wait=CANCEL_TIMEOUT_S if wait else None)
        if wait:
            self.show_finished()

    def __repr__(self) -> str:
        return f"<RunHandle {self.target.butler.name} {self.status} session={self.session_id}>"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        if self.view is not None:
            return self.view._repr_mimebundle_(**kwargs)
        return {"text/plain": repr(self)}


class Hub:
    """Services and runs of one kernel, all living on the background loop."""

    def __init__(self, store: SessionStore | None = None, loop: BackgroundLoop | None = None):
        self.store = store if store is not None else SessionStore()
        self.loop = loop or shared_loop()
        self._services: dict[tuple[Any, ...], ButlerService] = {}
        self._stacks: list[AsyncExitStack] = []
        self._lock = asyncio.Lock()
        self.runs: list[RunHandle] = []
        self.closed = False
        self._closing: Job[None] | None = None
        self._live: LiveStatus | None = None
        # Runs after any later-registered handler and before the loop stops
        # (atexit is last-in, first-out): services shut down cleanly at exit.
        atexit.register(self.close)

    async def _service(self, target: Target, extensions: Sequence[ToolExtension]) -> ButlerService:
        key = target.key()
        async with self._lock:
            service = self._services.get(key)
            if service is None:
                stack = AsyncExitStack()
                options: dict[str, Any] = {}
                if target.on is not None:
                    cluster = Cluster(target.client if target.client is not None else target.on)
                    stack.push_async_callback(asyncio.to_thread, cluster.close)
                    options["cluster"] = cluster
                service = await stack.enter_async_context(
                    ButlerService(
                        target.butler,
                        store=self.store,
                        replay=target.replay,
                        model=target.model,
                        tool_extensions=extensions,
                        **options,
                    )
                )
                self._stacks.append(stack)
                self._services[key] = service
            return service

    def schedule(self, delay: float, callback: Any) -> None:
        """Run ``callback`` on the background loop after ``delay`` seconds (thread-safe)."""
        loop = self.loop.loop
        loop.call_soon_threadsafe(loop.call_later, delay, callback)

    async def spawner_started(self, target: Target) -> Spawner:
        """The spawner of ``target``'s butler service, started if need be (on the loop)."""
        return (await self._service(target, ())).spawner

    def spawner_for(self, target: Target) -> Any:
        service = self._services.get(target.key())
        return service.spawner if service is not None else None

    def start(
        self,
        target: Target,
        prompt: str,
        *,
        context: str | None = None,
        max_turns: int | None = None,
        listeners: Sequence[EventSink] = (),
        view: Any | None = None,
        extensions: Sequence[ToolExtension] = (),
        limits: Limits | None = None,
        approver: Approver | None = None,
        repo: str | Path | None = None,
        source: str = "notebook",
        resume: str | None = None,
    ) -> RunHandle:
        """Start a run on the background loop; returns at once.

        ``source`` is the record's ``trigger_source``: where the run came from.

        ``approver`` answers the run's ``[butler.permissions] ask`` questions (a run
        view's :meth:`~spawnkit.notebook.view.RunView.approve`); None: they are denied.
        ``resume`` (a finished session of this butler and runtime) makes the run go on
        with that conversation, as a new session linked to it.
        """
        handle = RunHandle(self, target, view, prompt)
        sinks = [handle.observe, *listeners]

        def fan_out(event: RunEvent) -> None:
            for sink in sinks:
                sink(event)
            if isinstance(event, Started | Finished):
                self._move_queue(target)

        async def run() -> SpawnerResult:
            service = await self._service(target, extensions)
            if resume is not None:
                return await service.spawner.resume(
                    resume, prompt, context, on_event=fan_out, max_turns=max_turns,
                    limits=limits, approver=approver, trigger_source=source,
                )  # fmt: skip
            return await service.trigger(
                prompt, source, context=context, max_turns=max_turns, on_event=fan_out,
                limits=limits, approver=approver, repo=repo,
            )  # fmt: skip

        handle.job = self.loop.submit(run())
        self.runs.append(handle)
        if view is not None and hasattr(view, "stopper"):  # its Stop button cancels this run
            view.stopper = lambda: handle.cancel(wait=False)
        return handle

    def _move_queue(self, target: Target) -> None:
        """A slot of ``target``'s butler changed hands: tell the runs still queued their place.

        The spawner announces a position once, when a run is queued; without this
        the views would show it until the run starts.
        """
        key = target.key()
        waiting = [h for h in list(self.runs) if h.state == "queued" and h.position is not None]
        for position, handle in enumerate((h for h in waiting if h.target.key() == key), start=1):
            if handle.position != position and handle.session_id is not None:
                moved = Queued(handle.session_id, target.butler.name, position)
                handle.observe(moved)
                if handle.view is not None:
                    handle.view.handle(moved)

    def statuses(self) -> list[SpawnerStatus]:
        return [service.spawner.status for service in self._services.values()]

    def butlers(self) -> dict[str, ButlerConfig]:
        """The butlers this kernel has run, by name."""
        return {service.butler.name: service.butler for service in list(self._services.values())}

    def queue_report(self, butler: ButlerConfig) -> QueueReport:
        """``butler``'s waits, cool-downs and spend (reads the store: call it off the loop).

        The cool-down in effect is the longest among this kernel's spawners of the butler.
        """
        cooling = [
            service.spawner.pacer.cooling_for
            for service in list(self._services.values())
            if service.butler.name == butler.name
        ]
        return queue_report(self.store, butler, cooldown_s=max(cooling, default=0.0))

    def live(self) -> LiveStatus | None:
        """What every host sharing the store is running, kept up to date by the store's
        change feed (started on first use, on the background loop); None on SQLite."""
        if self._live is None and self.store.url is not None:
            from ..store.listen import ChangeFeed

            live = LiveStatus(self.store, ChangeFeed(self.store.url))

            async def start() -> None:
                live.attach()
                await live.feed.start()

            self.loop.submit(start()).future.result(FEED_START_TIMEOUT_S)
            self._live = live
        return self._live

    def in_flight(self) -> list[RunHandle]:
        return [h for h in self.runs if not h.done()]

    def cancel(self, which: str) -> list[RunHandle]:
        """Cancel runs whose session id starts with ``which``, or every run for ``all``."""
        chosen = [
            h for h in self.in_flight()
            if which == "all" or (h.session_id or "").startswith(which)
        ]  # fmt: skip
        for handle in chosen:
            handle.cancel()
        return chosen

    def drain(self, timeout: float) -> dict[str, int]:
        """Wait up to ``timeout`` for every butler's runs, then cancel the rest."""

        async def drain_all() -> dict[str, int]:
            totals = {"finished": 0, "cancelled": 0}
            results = await asyncio.gather(
                *(s.spawner.drain(timeout) for s in self._services.values())
            )
            for summary in results:
                for key in totals:
                    totals[key] += summary[key]
            return totals

        return self.loop.submit(drain_all()).future.result(timeout + CANCEL_TIMEOUT_S + 5)

    def close(self) -> None:
        """Stop every service (runs still going are cancelled and recorded).

        Safe to call again while a close is under way (a stop signal arriving while the
        kernel's exit closes the hub): the second call waits for the same close.
        """
        atexit.unregister(self.close)
        self.closed = True
        if self._live is not None:
            live, self._live = self._live, None

            async def stop_feed() -> None:
                live.detach()
                await live.feed.stop()

            try:
                self.loop.submit(stop_feed()).future.result(CANCEL_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                logger.warning("spawnkit: the change feed did not stop")
        if self._closing is None:
            if not self._stacks:
                return

            async def close_all() -> None:
                while self._stacks:
                    await self._stacks.pop().aclose()
                self._services.clear()

            self._closing = self.loop.submit(close_all())
        try:
            self._closing.future.result(CANCEL_TIMEOUT_S + 10)
        except concurrent.futures.TimeoutError:
            logger.warning("spawnkit: services did not stop within %s s", CANCEL_TIMEOUT_S + 10)


def with_runtime(butler: ButlerConfig, runtime: str) -> ButlerConfig:
    """The same butler run by another runtime."""
    return butler.with_runtime(runtime)


_default: Hub | None = None


def default_hub() -> Hub:
    """The kernel's hub, shared by the magics, spawn() and the dashboard."""
    global _default
    if _default is None or _default.closed:
        _default = Hub()
    return _default


def close_default_hub() -> None:
    global _default
    if _default is not None:
        _default.close()
        _default = None
