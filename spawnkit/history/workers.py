"""Parsing many transcript files on every core: worker processes, each given a run of files.

Parsing is CPU-bound Python (msgspec decodes, rows are built in the interpreter), so
threads would share one core; worker processes do not. The calling process is never forked:
a notebook kernel that has run agents and loaded Arrow data has a huge virtual size (pyarrow's
allocator, mimalloc, reserves writable arenas of 1, 2, 4 GiB... and never gives the address
space back; docs/history.md has the measurements), and ``fork()`` must account for all of it,
so it fails with ENOMEM where the memory is not overcommitted. Nor does a worker import the
caller's ``__main__``, as multiprocessing's own workers do: a script that loads history at its
top level would run again in each of them. Workers come from the parse server
(:mod:`~spawnkit.history.worker_server`), a fresh interpreter started once per process with
``subprocess`` (vfork and exec, which account for nothing) and the parser imported, which
forks a pool of workers from itself for each load in milliseconds. The first parallel load
of a process pays the server's start (an import of spawnkit). Loads under
:data:`PARALLEL_MIN_BYTES` are not worth it and are parsed in-process. The sorted file list
is cut into contiguous runs of about the same number of bytes, a few per worker so that a
worker that finishes early takes another. Each run's rows are written as Arrow IPC files into
a folder that the caller memory-maps (sending them back through a pipe cost more than parsing
half of the files): a temporary one, or the cache's new generation, which then keeps them.
Runs are concatenated in order, so the rows keep the path order deduplication relies on.

Bounds: at most :data:`MAX_WORKERS` processes, only for loads of at least
:data:`PARALLEL_MIN_BYTES`, a load awaited at most :data:`RESULT_TIMEOUT_S`. A load that is
interrupted (Ctrl-C in a notebook), times out or loses its server kills the server's process
group, workers included; the next load starts a new one. The temporary folder is removed
whatever happens; one that a caller killed with SIGKILL left behind (its name holds the
caller's pid) is removed by a later load once older than any load may last. A failure in a
worker is raised in the caller, not swallowed.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from .._process import pid_exists
from .cache import read_run
from .rows import RowTables
from .worker_server import Job

MAX_WORKERS = 4
RUNS_PER_WORKER = 8
PARALLEL_MIN_BYTES = 32 << 20
RESULT_TIMEOUT_S = 600.0
TEMP = "spawnkit-history-"
ORPHAN_AGE_S = RESULT_TIMEOUT_S  # a dead caller's folder older than this is removed

T = TypeVar("T")


def default_workers(total_bytes: int) -> int:
    """How many workers a load of ``total_bytes`` gets by default (1: parse in-process)."""
    if sys.platform == "win32" or total_bytes < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def runs(sizes: Sequence[int], count: int) -> list[range]:
    """Index ranges cutting ``sizes`` into at most ``count`` runs of about equal total."""
    total = sum(sizes) or 1
    out: list[range] = []
    start = acc = 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= total * (len(out) + 1) / count and len(out) < count - 1:
            out.append(range(start, i + 1))
            start = i + 1
    out.append(range(start, len(sizes)))
    return [run for run in out if len(run)]


def parse_in_workers(
    parse: Callable[[Sequence[T]], RowTables],
    items: Sequence[T],
    sizes: Sequence[int],
    workers: int,
    into: Path | None = None,
) -> tuple[RowTables, list[str]]:
    """``parse`` applied to runs of ``items`` in ``workers`` processes, in order, and the
    names of the runs' folders in ``into`` (:func:`~spawnkit.history.cache.write_run`), kept
    for the caller; none when ``into`` is None (a temporary folder) or the load was too small
    to share, and parsed here.

    ``parse`` is sent to the workers by reference, so it must be importable (a module-level
    function or a partial of one)."""
    # More runs than workers: a worker that finishes early takes the next run.
    cuts = runs(sizes, workers * RUNS_PER_WORKER)
    if len(cuts) <= 1:
        return parse(items), []
    with contextlib.ExitStack() as stack:
        folder = into
        if folder is None:
            sweep_orphans()
            temp = tempfile.TemporaryDirectory(prefix=f"{TEMP}{os.getpid()}-")
            folder = Path(stack.enter_context(temp))
        names = [str(i) for i in range(len(cuts))]
        job = Job(
            parse,
            chunks=[items[cut.start : cut.stop] for cut in cuts],
            folders=[str(folder / name) for name in names],
            weights=[sum(sizes[cut.start : cut.stop]) for cut in cuts],
            workers=min(workers, len(cuts)),
        )
        SERVER.run(job, RESULT_TIMEOUT_S)
        # Mapped tables stay valid after the folder is removed (POSIX keeps unlinked maps).
        parts = [read_run(folder / name) for name in names]
    rows = RowTables(
        *(pa.concat_tables([getattr(p, kind) for p in parts]) for kind in RowTables.KINDS)
    )
    return rows, names if into is not None else []


def sweep_orphans() -> None:
    """Remove the temporary folders of loads whose caller died (SIGKILL leaves them), once
    older than any load may last (a caller in another pid namespace that shares this
    temporary folder looks dead from here)."""
    now = time.time()
    for entry in Path(tempfile.gettempdir()).glob(f"{TEMP}*-*"):
        pid = entry.name.removeprefix(TEMP).split("-", 1)[0]
        if not pid.isdigit() or pid_exists(int(pid)):
            continue
        with contextlib.suppress(OSError):  # another load removed it first
            if now - entry.stat().st_mtime > ORPHAN_AGE_S:
                shutil.rmtree(entry, ignore_errors=True)


# The server's bootstrap: the caller's import path, then serve(fd, parent pid).
_BOOTSTRAP = (
    "import json, sys; sys.path[:0] = json.loads(sys.argv[3]); "
    "from spawnkit.history.worker_server import serve; serve(int(sys.argv[1]), int(sys.argv[2]))"
)


class ParseServer:
    """This process's parse server, started on first use; one load at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: multiprocessing.connection.Connection | None = None

    def run(self, job: Job, timeout: float) -> None:
        """Run ``job``; raise what a worker raised, or TimeoutError past ``timeout``."""
        with self._lock:
            conn = self._connect()
            try:
                conn.send(job)
                if not conn.poll(timeout):
                    raise TimeoutError(f"parsing transcripts took over {timeout:g} s")
                status, error = conn.recv()
            except (EOFError, ConnectionError) as exc:
                # The server died (killed, out of memory): an end of file, or a reset when
                # it died with the job still unread in its socket.
                code = self._process.poll() if self._process else None
                self.stop()
                raise RuntimeError(
                    f"the history parse server ended while parsing (exit status {code})"
                ) from exc
            except BaseException:
                self.stop()  # interrupted, timed out or lost: nothing of the load lives on
                raise
        if status != "ok":
            assert error is not None
            raise error

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process and self._process.poll() is None else None

    def stop(self) -> None:
        """Kill the server and its workers (its process group), and reap it."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is not None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def _connect(self) -> multiprocessing.connection.Connection:
        if self._process is not None and self._process.poll() is None and self._conn:
            return self._conn
        self.stop()
        ours, theirs = socket.socketpair()
        with ours, theirs:
            fd = theirs.fileno()
            self._process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(fd), str(os.getpid()),
                 json.dumps([p for p in sys.path if isinstance(p, str)])],
                pass_fds=(fd,), stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            self._conn = multiprocessing.connection.Connection(ours.detach())
        return self._conn


SERVER = ParseServer()
