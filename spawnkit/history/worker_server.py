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

import ctypes
import ctypes.util
import importlib
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from .cache import write_run
from .rows import RowTables

PR_SET_PDEATHSIG = 1
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


def die_with_parent(parent: int) -> None:
    """End this process when ``parent`` ends (Linux; elsewhere the socket's EOF does it)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it ended before the signal was asked for
        os._exit(1)


def run(context: BaseContext, job: Job, answer: Answer) -> None:
    """Run ``job`` and ``answer`` ``("ok", None)`` or ``("error", the first exception a worker
    raised)``. A success is told before the idle workers are stopped and reaped; a failure
    only once none is left that could still write into the job's folders."""
    pool = context.Pool(job.workers, initializer=die_with_parent, initargs=(os.getpid(),))
    failure: BaseException | None = None
    try:
        # Largest runs first, so no worker is left with a big one at the end.
        order = sorted(range(len(job.chunks)), key=lambda i: -job.weights[i])
        pending = [
            pool.apply_async(parse_to_files, (job.parse, job.chunks[i], job.folders[i]))
            for i in order
        ]
        try:
            for result in pending:
                result.get()  # the caller bounds the wait, and kills this process past it
        except Exception as exc:  # noqa: BLE001 - whatever a worker raised, the caller raises
            failure = exc
        else:
            answer("ok", None)
    finally:
        pool.terminate()  # idle or stuck, the workers end here
        pool.join()
    if failure is not None:
        answer("error", failure)


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
        try:
            pickle.dumps(error)
        except (pickle.PicklingError, TypeError, AttributeError):
            error = RuntimeError(f"a parse worker failed: {error!r}")
        conn.send((status, error))

    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        run(context, job, answer)
