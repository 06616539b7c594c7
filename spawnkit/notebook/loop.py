"""The event loop the notebook frontends run spawnkit on: one daemon thread per kernel.

Jupyter kernels already run an asyncio loop, and a cell that blocks on it (or
calls ``asyncio.run`` inside it) fails with "event loop is already running".
Instead of patching the kernel's loop (nest-asyncio), spawnkit runs its
spawners, MCP servers and replay servers on a loop of its own, in a thread
that never blocks the kernel and is never blocked by it. Cells talk to it
through :meth:`BackgroundLoop.submit` (a ``concurrent.futures.Future``) and
:meth:`BackgroundLoop.run` (block until done; Ctrl-C / the kernel's stop
button cancels the coroutine, waits for its cleanup, then re-raises
``KeyboardInterrupt``). See docs/notebook.md for why nest-asyncio is not used.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

START_TIMEOUT_S = 10.0
# How long an interrupted run may take to kill its CLI and record itself.
CANCEL_TIMEOUT_S = 30.0
POLL_S = 0.05
# How long the tasks left on the loop when it stops may take to end once cancelled.
FINISH_TIMEOUT_S = 5.0


class BackgroundLoop:
    """An asyncio loop on a daemon thread."""

    def __init__(self, name: str = "spawnkit-loop") -> None:
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("spawnkit's background event loop did not start")

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                _finish_tasks(loop)
            finally:
                loop.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> Job[T]:
        """Schedule ``coro`` on the loop as a task."""
        job: Job[T] = Job(self)
        job.future = asyncio.run_coroutine_threadsafe(job.wrap(coro), self.loop)
        return job

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop; nothing once the loop has closed (at exit, a widget
        closed by the garbage collector asks to cancel what the closed loop already ended)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(callback)

    def run(
        self,
        coro: Coroutine[Any, Any, T],
        *,
        idle: Callable[[], None] | None = None,
    ) -> T:
        """Run ``coro`` on the loop and wait for it, calling ``idle`` while waiting.

        ``idle`` runs on the calling thread between short waits (the notebook
        view flushes its updates there). An interrupt cancels the coroutine,
        waits up to CANCEL_TIMEOUT_S for it to clean up, and re-raises.
        """
        if self.in_loop_thread:
            raise RuntimeError("BackgroundLoop.run() cannot be called from its own thread")
        job = self.submit(coro)
        try:
            while True:
                try:
                    return job.future.result(timeout=POLL_S)
                except concurrent.futures.TimeoutError:
                    if idle is not None:
                        idle()
        except KeyboardInterrupt:
            job.cancel(wait=CANCEL_TIMEOUT_S)
            raise
        finally:
            if idle is not None:
                idle()

    def stop(self, timeout: float = FINISH_TIMEOUT_S + 5.0) -> None:
        if self._thread.is_alive() and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)


def _finish_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what still runs on a stopped ``loop`` and let it end, as ``asyncio.run`` does.

    Libraries leave tasks of their own on a loop that serves them: sse-starlette (the MCP
    SDK's server-sent events) starts one ``_shutdown_watcher`` per loop that polls until the
    process ends, with no way to stop it. Closed with such a task pending, the loop drops it
    and Python prints "Task was destroyed but it is pending!" at exit.
    """
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=FINISH_TIMEOUT_S))
    loop.run_until_complete(loop.shutdown_asyncgens())


class Job(Generic[T]):
    """A coroutine running on the background loop.

    Unlike cancelling the ``concurrent.futures.Future`` of
    ``run_coroutine_threadsafe`` (which reports "cancelled" at once, while the
    task is still cleaning up), :meth:`cancel` cancels the task and can wait
    until it has really finished.
    """

    def __init__(self, owner: BackgroundLoop) -> None:
        self.owner = owner
        self.future: concurrent.futures.Future[T]
        self._task: asyncio.Task[T] | None = None
        self._cancel_requested = False

    async def wrap(self, coro: Coroutine[Any, Any, T]) -> T:
        self._task = asyncio.current_task()
        if self._cancel_requested:
            coro.close()
            raise asyncio.CancelledError
        return await coro

    def done(self) -> bool:
        return self.future.done()

    def __await__(self) -> Generator[Any, None, T]:
        """Await the job from another loop (a notebook cell's top-level ``await``)."""
        return asyncio.wrap_future(self.future).__await__()

    def cancel(self, wait: float | None = None) -> None:
        """Cancel the task; with ``wait``, block up to that long for its cleanup."""
        self._cancel_requested = True

        def cancel_task() -> None:
            if self._task is not None:
                self._task.cancel()

        self.owner.call_soon(cancel_task)
        if wait:
            concurrent.futures.wait([self.future], timeout=wait)


_shared: BackgroundLoop | None = None
_shared_lock = threading.Lock()


def shared_loop() -> BackgroundLoop:
    """The process-wide background loop, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = BackgroundLoop()
            atexit.register(_shared.stop)
        return _shared
