"""The parse server: a small process that runs a pool of parse workers for one caller.

:mod:`spawnkit.history.workers` starts it (``python -c`` with the caller's ``sys.path``, so
it finds spawnkit wherever the caller did) and sends it jobs over a socket. The server
imports the parser once, then for each job forks a fresh pool of workers from itself: a
small, single-threaded process, cheap and safe to fork. Its own ``__main__`` is this module,
so a worker never imports the caller's script, as multiprocessing's spawn and forkserver
workers do (a script that loads history without an ``if __name__ == "__main__"`` guard
would run again in every worker, and start workers of its own: it hung).

Lifetime: the server ends when its caller closes the socket (at exit) or dies (Linux: the
parent-death signal; it also checks its parent at start). Each worker ends with the server
the same way. The caller kills the server's process group when a job is interrupted or
times out, so no parse outlives the load that asked for it.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from .._process import die_with_parent
from .cache import write_run
from .rows import RowTables

# How a job's end is told: ("ok", None) or ("error", what a worker raised).
Answer = Callable[[str, BaseException | None], None]


@dataclass(frozen=True)
class Job:
    """Parse ``chunks[i]`` into the Arrow IPC files of ``folders[i]``, on ``workers``
    processes, the largest chunks first (``weights``)."""

    parse: Callable[[Sequence[Any]], RowTables]
    chunks: list[Sequence[Any]]
    folders: list[str]
    weights: list[int]
    workers: int


def run(context: BaseContext, job: Job, answer: Answer) -> None:
    """Run ``job`` and ``answer`` ``("ok", None)`` or ``("error", the first exception a worker
    raised)``. A success is told before the idle workers are killed and reaped; a failure
    only once none is left that could still write into the job's folders.

    The workers are ours, one pipe each, not a ``multiprocessing.Pool``: stopping a pool whose
    task was failing deadlocked in ``Pool.terminate`` (its task thread waiting on the queue
    lock of a killed worker), and a pool replaces a worker that died without telling anyone
    who waits for its task."""
    # Largest runs first (popped from the end), so no worker is left with a big one at the end.
    todo = sorted(range(len(job.chunks)), key=lambda i: job.weights[i])
    crew = [_Worker(context, job.parse) for _ in range(job.workers)]
    failure: BaseException | None = None
    try:
        busy: dict[object, _Worker] = {}
        idle = list(crew)
        while failure is None and (todo or busy):
            while todo and idle:
                worker, i = idle.pop(), todo.pop()
                worker.conn.send((job.chunks[i], job.folders[i]))
                busy[worker.conn] = worker
            # The caller bounds the wait, and kills this process past it.
            for conn in wait([worker.conn for worker in busy.values()]):
                worker = busy.pop(conn)
                outcome = worker.outcome()
                failure = failure or outcome
                idle.append(worker)
        if failure is None:
            answer("ok", None)
    finally:
        for worker in crew:  # idle or stuck, the workers end here
            worker.kill()
    if failure is not None:
        answer("error", failure)


class _Worker:
    """A forked worker and its end of a pipe: it gets ``(chunk, folder)`` and answers None
    (done) or the exception its parse raised."""

    def __init__(self, context: BaseContext, parse: Callable[[Sequence[Any]], RowTables]) -> None:
        self.conn, theirs = context.Pipe()
        self.process = context.Process(  # type: ignore[attr-defined]
            target=_work, args=(theirs, parse, os.getpid()), daemon=True
        )
        self.process.start()
        theirs.close()

    def outcome(self) -> BaseException | None:
        """What the worker answered for its task: None when it wrote its run."""
        try:
            error: BaseException | None = self.conn.recv()
        except EOFError:  # killed (out of memory?), or it exited
            self.process.join()
            return RuntimeError(
                f"a parse worker ended while parsing (exit status {self.process.exitcode})"
            )
        return error

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


def _work(conn: Connection, parse: Callable[[Sequence[Any]], RowTables], server: int) -> None:
    die_with_parent(server)
    while True:
        try:
            chunk, folder = conn.recv()
        except EOFError:  # the server ended
            return
        try:
            parse_to_files(parse, chunk, folder)
        except Exception as exc:  # noqa: BLE001 - whatever the parse raised, the caller raises
            conn.send(_picklable(exc))
        else:
            conn.send(None)


def _picklable(error: BaseException) -> BaseException:
    """``error``, or a RuntimeError naming it when it cannot be sent."""
    try:
        pickle.dumps(error)
    except (pickle.PicklingError, TypeError, AttributeError):
        return RuntimeError(f"a parse worker failed: {error!r}")
    return error


def parse_to_files(parse: Callable[[Sequence[Any]], RowTables], chunk: Any, folder: str) -> None:
    write_run(parse(chunk), Path(folder))


def serve(fd: int, parent: int) -> None:
    """Answer the jobs sent over socket ``fd`` until it closes."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides when to stop
    # Imported once here, so every forked worker starts with the parser in memory.
    importlib.import_module("spawnkit.history.transcript_loader")
    # This process is small and has no threads between jobs: forking it is cheap and safe.
    method = "fork" if sys.platform == "linux" else "spawn"
    context = multiprocessing.get_context(method)
    conn = Connection(fd)

    def answer(status: str, error: BaseException | None) -> None:
        conn.send((status, None if error is None else _picklable(error)))

    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        run(context, job, answer)
