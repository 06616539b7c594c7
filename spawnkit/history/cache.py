"""The incremental cache: parsed rows of every transcript file, keyed by path, size and mtime.

A load stats every file, reuses the cached rows of files whose size and modification time
are unchanged, parses only the files that are new, grew or changed, and writes the merged
rows back (on a thread, while the frames are built). The rows live in Arrow IPC files under
``$SPAWNKIT_HOME/history-cache/<source>-<hash of the root>/``; they are memory-mapped on
read, so a warm load of a large history costs little more than the stats.

A set of rows is a generation: a folder of runs, each run a folder with one file per kind of
row (usage, calls, results, events, files). ``current.json`` names the generation in use and
its runs in order; it is replaced by a rename only once the generation is complete, so a
reader sees a whole generation or none, and a cache whose manifest or files do not read (a
crash, a full disk, an older format) is ignored and rebuilt, never trusted. A cold load
parsed by worker processes adopts the files the workers wrote as its generation, so its rows
are written once, not once by the workers and again by the cache. The cache only holds
previews of tool inputs and outputs (see :mod:`spawnkit.history.rows`), so its size is
bounded by the number of rows, not by what the tools returned.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ..home import spawnkit_home
from .rows import CALL_SCHEMA, EVENT_SCHEMA, FILE_SCHEMA, RESULT_SCHEMA, USAGE_SCHEMA, RowTables

FORMAT = "spawnkit-history-cache-4"
MANIFEST = "current.json"
GENERATION_PREFIX = "gen-"
# A generation that is not current and older than this is a writer's that lost a race or
# died: removed. A writer takes well under this between creating a generation and adopting it.
STALE_AFTER_S = 3600.0
_KINDS = RowTables.KINDS
SCHEMAS = dict(
    zip(_KINDS, (USAGE_SCHEMA, CALL_SCHEMA, RESULT_SCHEMA, EVENT_SCHEMA, FILE_SCHEMA), strict=True)
)
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
    """Read and write the cached rows of one source folder.

    The folder holds generations, each a folder of runs (``<generation>/<run>/<kind>``, Arrow
    IPC files), and a manifest, ``current.json``, naming the generation in use and its runs
    in order. A generation is complete before the manifest names it (written under a new
    name, then the manifest replaced by a rename), so a reader sees one whole generation or
    none. A load that parsed everything in worker processes adopts the workers' own files as
    the new generation (:meth:`new_generation`, :meth:`adopt`): nothing is written twice.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def manifest(self) -> Path:
        return self.directory / MANIFEST

    def read(self) -> RowTables | None:
        """The cached rows, or None when there is no complete, current cache."""
        try:
            meta = json.loads(self.manifest.read_bytes())
            if meta.get("format") != FORMAT:
                return None
            generation = self.directory / _plain(meta["generation"])
            runs = [generation / _plain(run) for run in meta["runs"]]
            tables = [_concat([_map(run / kind) for run in runs], kind) for kind in _KINDS]
            return RowTables(*tables)
        except FileNotFoundError:
            return None  # none yet, or a generation replaced while we read: parse again
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid) as exc:
            log.warning("ignoring the unreadable history cache %s: %s", self.directory, exc)
            return None

    def new_generation(self) -> Path:
        """An empty folder for a generation's runs, which :meth:`adopt` makes current."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Path(tempfile.mkdtemp(prefix=GENERATION_PREFIX, dir=self.directory))

    def adopt(self, generation: Path, runs: Sequence[str]) -> bool:
        """Make ``generation`` (complete, its ``runs`` in order) the cache's rows; False
        (logged) when the manifest cannot be written."""
        meta = {"format": FORMAT, "generation": generation.name, "runs": list(runs)}
        try:
            before = json.loads(self.manifest.read_bytes()).get("generation")
        except (OSError, ValueError, AttributeError):
            before = None
        tmp = self.directory / f".{MANIFEST}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            tmp.write_text(json.dumps(meta), encoding="utf-8")
            tmp.replace(self.manifest)
        except OSError as exc:
            log.warning("could not write the history cache %s: %s", self.directory, exc)
            return False
        finally:
            tmp.unlink(missing_ok=True)
        replaced = isinstance(before, str) and before.startswith(GENERATION_PREFIX)
        if replaced and before != generation.name and Path(str(before)).name == before:
            # Readers that mapped its files keep them.
            shutil.rmtree(self.directory / str(before), ignore_errors=True)
        self._remove_stale(keep=generation.name)
        return True

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
        generation = self.new_generation()
        try:
            write_run(rows, generation / "0")
        except BaseException:
            shutil.rmtree(generation, ignore_errors=True)
            raise
        if not self.adopt(generation, ["0"]):
            shutil.rmtree(generation, ignore_errors=True)

    def _remove_stale(self, keep: str) -> None:
        """Remove generations other than ``keep`` once no writer can still be filling them
        (older than :data:`STALE_AFTER_S`), and the files of an older cache format. A reader
        that mapped a removed generation's files keeps them (POSIX keeps unlinked maps)."""
        now = time.time()
        for entry in self.directory.iterdir():
            name = entry.name
            try:
                if entry.is_dir() and name.startswith(GENERATION_PREFIX) and name != keep:
                    if now - entry.stat().st_mtime > STALE_AFTER_S:
                        shutil.rmtree(entry, ignore_errors=True)
                elif name.endswith(".arrow") or (
                    name.endswith(".tmp") and now - entry.stat().st_mtime > STALE_AFTER_S
                ):
                    entry.unlink(missing_ok=True)  # format 3's files, or a writer's leftovers
            except FileNotFoundError:
                continue  # another process removed it first


def write_run(rows: RowTables, folder: Path) -> None:
    """Write ``rows`` as one run: a folder of Arrow IPC files, one per kind of row."""
    folder.mkdir()
    for kind in _KINDS:
        table: pa.Table = getattr(rows, kind)
        with pa.OSFile(str(folder / kind), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=1 << 20)


def read_run(folder: Path) -> RowTables:
    """The rows of a run :func:`write_run` wrote (memory-mapped)."""
    return RowTables(*(_map(folder / kind) for kind in _KINDS))


def _plain(name: object) -> str:
    """A manifest's folder name, which must name a folder right there."""
    if not isinstance(name, str) or not name or Path(name).name != name:
        raise ValueError(f"the manifest names {name!r}")
    return name


def _map(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def _concat(tables: list[pa.Table], kind: str) -> pa.Table:
    schema = SCHEMAS[kind]
    for table in tables:
        if not table.schema.equals(schema):
            raise ValueError(f"its {kind} rows have another schema")
    return pa.concat_tables(tables) if tables else schema.empty_table()


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
