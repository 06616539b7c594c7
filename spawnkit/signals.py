"""SIGTERM and SIGHUP stop runs the way Ctrl-C does: cancelled, recorded, cleaned up.

``asyncio.run`` turns the first Ctrl-C into a cancellation of its main task, which every
run unwinds through: the CLI's process group is terminated, the workspace removed, the
record completed as ``cancelled``. Closing a terminal (SIGHUP), ``kill PID``, or systemd
or docker stopping a service (SIGTERM) would instead end the process on the spot and
leave its runs to the start-up sweep (:mod:`spawnkit.containment.sweep`) as ``crashed``.

The frontends that own runs install these handlers for as long as they own them, never
at import, and put back whatever was there before:

* :func:`run` for a command (``spawnkit run``, ``serve``, the contract's worker):
  ``asyncio.run``, in which SIGTERM and SIGHUP cancel the main task as the first Ctrl-C
  does, then raise :class:`Stopped` naming the signal (exit status ``128 + signum``);
* :func:`on_stop_signals` for a long-lived host (a Jupyter kernel): a callback stops its
  runs, then the signal takes its previous course (by default it ends the process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar

from .errors import SpawnkitError

logger = logging.getLogger(__name__)

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_Handler = Callable[[int, FrameType | None], Any] | int | None


class Stopped(SpawnkitError):
    """A stop signal cancelled the command; its runs were cancelled and recorded."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``; SIGTERM or SIGHUP cancel ``main``, then raise :class:`Stopped`.

    ``main`` unwinds exactly as on Ctrl-C (its runs are cancelled and recorded, their
    processes and workspaces are gone) before :class:`Stopped` is raised. Further stop
    signals during that cleanup are absorbed: it is bounded, and SIGKILL still works.
    """
    return asyncio.run(_cancel_on_signals(main))


async def _cancel_on_signals(main: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def stop(signum: int) -> None:
        if not received:
            received.append(signum)
            task.cancel()

    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    try:
        # A run that ends on its own just as a signal comes returns its result as usual.
        return await main
    except asyncio.CancelledError:
        if not received:
            raise
        task.uncancel()
        raise Stopped(received[0]) from None
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def on_stop_signals(stop: Callable[[], None]) -> Callable[[], None] | None:
    """On SIGTERM or SIGHUP call ``stop``, then let the signal take its previous course.

    For a process that lives on while runs come and go (a Jupyter kernel). ``stop``
    runs in the main thread and should return once the runs are recorded. A second
    signal while it runs is absorbed. Returns a function that puts the previous
    handlers back, or None when this is not the main thread (handlers cannot be set).
    """
    if threading.current_thread() is not threading.main_thread():
        logger.debug("not the main thread: SIGTERM and SIGHUP keep their handlers")
        return None
    previous: dict[int, _Handler] = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    stopping = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        try:
            stop()
        except Exception:  # the signal must still take its course
            logger.exception("stopping runs on %s failed", signal.Signals(signum).name)
        finally:
            restore()
        _forward(signum, frame, previous[signum])

    def restore() -> None:
        for signum, old in previous.items():
            if signal.getsignal(signum) is handler:
                signal.signal(signum, signal.SIG_DFL if old is None else old)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    return restore


def _forward(signum: int, frame: FrameType | None, previous: _Handler) -> None:
    """Do what would have happened to ``signum`` without us."""
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        os.kill(os.getpid(), signum)  # the default action, now restored: the process ends


async def finish_in_thread(cleanup: Callable[..., object], *args: Any) -> None:
    """Run ``cleanup(*args)`` in a thread, off the event loop, and return when it is done,
    even through cancellations (raised once it is done): a cancelled run unwinds only
    after what must not outlive it is gone. A loop whose executor is shut down (closing)
    runs it here."""
    try:
        work = asyncio.get_running_loop().run_in_executor(None, cleanup, *args)
    except RuntimeError:
        cleanup(*args)
        return
    await finish(work)


async def finish(work: Awaitable[Any]) -> None:
    """Wait for ``work`` to be done, even through cancellations (raised once it is done)."""
    future = asyncio.ensure_future(work)
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True
    future.result()
    if cancelled:
        raise asyncio.CancelledError
