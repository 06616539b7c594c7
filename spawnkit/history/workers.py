"""Parsing many transcript files on every core: worker processes, each given a run of files.

Parsing is CPU-bound Python (msgspec decodes, rows are built in the interpreter), so
threads would share one core; worker processes do not. The calling process is never forked:
a notebook kernel that has run agents and loaded Arrow data has a huge virtual size (pyarrow's
allocator, mimalloc, reserves writable arenas of 1, 2, 4 GiB... and never gives the address
space back; docs/history.md has the measurements), and ``fork()`` must account for all of it,
so it fails with ENOMEM where the memory is not overcommitted. Workers come from
multiprocessing's forkserver (a fresh interpreter started by fork and an immediate
exec, which accounts for nothing) with the parser imported, which forks each worker from
itself in milliseconds. The first parallel load of a process pays the server's start (an
import of spawnkit); the server lives as long as the process, as multiprocessing arranges.
Loads under :data:`PARALLEL_MIN_BYTES` are not worth it and are parsed in-process. The sorted
file list is cut into contiguous runs of about the same number of bytes, a few per worker so
that a worker that finishes early takes another. Each run's rows are written as Arrow IPC
files into a temporary folder that the caller memory-maps (sending them back through the
pool's pipe cost more than parsing half of the files); runs are concatenated in order, so
the rows keep the path order deduplication relies on.

Bounds: at most :data:`MAX_WORKERS` processes, only for loads of at least
:data:`PARALLEL_MIN_BYTES`, all results awaited at most :data:`RESULT_TIMEOUT_S`; the pool is
terminated and joined before returning, whatever happens, and the temporary folder removed.
A failure in a worker is raised in the caller, not swallowed.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from .rows import RowTables

MAX_WORKERS = 4
RUNS_PER_WORKER = 4
PARALLEL_MIN_BYTES = 32 << 20
RESULT_TIMEOUT_S = 600.0

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
) -> RowTables:
    """``parse`` applied to runs of ``items`` in ``workers`` processes, in order.

    ``parse`` is sent to the workers by reference, so it must be importable (a module-level
    function or a partial of one)."""
    # More runs than workers: a worker that finishes early takes the next run.
    cuts = runs(sizes, workers * RUNS_PER_WORKER)
    if len(cuts) <= 1:
        return parse(items)
    chunks = [items[cut.start : cut.stop] for cut in cuts]
    context = _context()
    with tempfile.TemporaryDirectory(prefix="spawnkit-history-") as tmp:
        folders = [Path(tmp) / str(i) for i in range(len(chunks))]
        pool = context.Pool(min(workers, len(chunks)))
        try:
            # Largest runs first, so no worker is left with a big one at the end.
            weights = [sum(sizes[cut.start : cut.stop]) for cut in cuts]
            biggest_first = sorted(range(len(chunks)), key=lambda i: -weights[i])
            pending = [
                pool.apply_async(_parse_to_files, (parse, chunks[i], folders[i]))
                for i in biggest_first
            ]
            deadline = time.monotonic() + RESULT_TIMEOUT_S
            for result in pending:
                result.get(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            pool.terminate()  # idle or stuck, the workers end here
            pool.join()
        # Mapped tables stay valid after the folder is removed (Linux keeps unlinked maps).
        parts = [_read_files(folder) for folder in folders]
    return RowTables(
        *(pa.concat_tables([getattr(p, kind) for p in parts]) for kind in RowTables.KINDS)
    )


def _context() -> multiprocessing.context.BaseContext:
    """The forkserver context, with the parser preloaded in the server (Linux, macOS)."""
    context = multiprocessing.get_context("forkserver")
    # The server imports this before forking workers, so they start with it in memory.
    context.set_forkserver_preload(["spawnkit.history.transcript_loader"])
    return context


def _parse_to_files(
    parse: Callable[[Sequence[T]], RowTables], chunk: Sequence[T], folder: Path
) -> None:
    rows = parse(chunk)
    folder.mkdir()
    for kind in RowTables.KINDS:
        table: pa.Table = getattr(rows, kind)
        with pa.OSFile(str(folder / kind), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)


def _read_files(folder: Path) -> RowTables:
    tables = []
    for kind in RowTables.KINDS:
        with pa.memory_map(str(folder / kind)) as source:
            tables.append(pa.ipc.open_file(source).read_all())
    return RowTables(*tables)
