"""The incremental cache: parsed rows of every transcript file, keyed by path, size and mtime.

A load stats every file, reuses the cached rows of files whose size and modification time
are unchanged, parses only the files that are new, grew or changed, and writes the merged
rows back (on a thread, while the frames are built). The rows live in five Arrow IPC files
(usage, calls, results, events, files) under
``$SPAWNKIT_HOME/history-cache/<source>-<hash of the root>/``; they are memory-mapped on
read, so a warm load of a large history costs little more than the stats.

Each file is written to a temporary name and renamed into place, and all five carry the same
generation token in their schema metadata: a set whose tokens disagree (two writers raced,
or a write was interrupted) or whose format version is old is ignored and rebuilt, never
trusted. The cache only holds previews of tool inputs and outputs (see
:mod:`spawnkit.history.rows`), so its size is bounded by the number of rows, not by what the
tools returned.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ..home import spawnkit_home
from .rows import RowTables

FORMAT = b"spawnkit-history-cache-3"
_KINDS = RowTables.KINDS
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileStat:
    """A file as the cache knows it."""

    path: str
    size: int
    mtime_ns: int


def cache_dir(source: str, root: Path) -> Path:
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return spawnkit_home() / "history-cache" / f"{source}-{digest}"


class RowCache:
    """Read and write the cached rows of one source folder."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def read(self) -> RowTables | None:
        """The cached rows, or None when there is no complete, current cache."""
        tables: dict[str, pa.Table] = {}
        generations = set()
        for kind in _KINDS:
            path = self.directory / f"{kind}.arrow"
            try:
                with pa.memory_map(str(path)) as source:
                    table = pa.ipc.open_file(source).read_all()
            except FileNotFoundError:
                return None
            except (OSError, pa.ArrowInvalid) as exc:
                log.warning("ignoring the unreadable history cache %s: %s", path, exc)
                return None
            meta = table.schema.metadata or {}
            if meta.get(b"format") != FORMAT:
                return None
            generations.add(meta.get(b"generation"))
            tables[kind] = table.replace_schema_metadata(None)
        if len(generations) != 1:
            log.warning("ignoring the history cache %s: its files disagree", self.directory)
            return None
        return RowTables(**tables)

    def write_in_background(self, rows: RowTables) -> threading.Thread:
        """Write ``rows`` on a thread (Arrow writes without the GIL); join it before relying
        on the cache. A failed write is logged and leaves the previous cache or none."""

        def run() -> None:
            try:
                self.write(rows)
            except OSError as exc:
                log.warning("could not write the history cache %s: %s", self.directory, exc)

        thread = threading.Thread(target=run, name="spawnkit-history-cache", daemon=False)
        thread.start()
        return thread

    def write(self, rows: RowTables) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        generation = uuid.uuid4().hex.encode()
        for kind in _KINDS:
            table: pa.Table = getattr(rows, kind)
            table = table.replace_schema_metadata({b"format": FORMAT, b"generation": generation})
            final = self.directory / f"{kind}.arrow"
            tmp = final.with_name(f".{kind}.{os.getpid()}.{generation.decode()}.tmp")
            try:
                with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                    w.write_table(table, max_chunksize=1 << 20)
                tmp.replace(final)
            finally:
                tmp.unlink(missing_ok=True)


def unchanged(cached: RowTables, stats: list[FileStat]) -> set[str]:
    """Paths whose cached size and mtime equal the current ones."""
    files = cached.files.select(["path", "size", "mtime_ns"]).to_pydict()
    known = set(zip(files["path"], files["size"], files["mtime_ns"], strict=True))
    return {s.path for s in stats if (s.path, s.size, s.mtime_ns) in known}


def keep_paths(rows: RowTables, paths: set[str]) -> RowTables:
    """Only the rows of ``paths``."""
    keep = pa.array(sorted(paths), pa.string())

    def only(table: pa.Table) -> pa.Table:
        return table.filter(pc.is_in(table["path"], value_set=keep))

    return RowTables(*(only(getattr(rows, k)) for k in _KINDS))


def merge(old: RowTables, new: RowTables) -> RowTables:
    """Old and new rows, ordered by path so deduplication sees files in a stable order."""

    def join(kind: str) -> pa.Table:
        table = pa.concat_tables([getattr(old, kind), getattr(new, kind)])
        if table.num_rows == 0:
            return table
        # A stable sort on path keeps each file's rows in line order.
        order = pc.sort_indices(table, sort_keys=[("path", "ascending")])
        return table.take(order)

    return RowTables(*(join(k) for k in _KINDS))
