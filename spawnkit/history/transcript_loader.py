"""The agent CLIs' own transcripts as DataFrames: ``transcripts("claude-code" | "codex" | …)``.

Each source names where its CLI keeps transcripts, how to find the files and how to parse
one (:mod:`~spawnkit.history.formats`). Loading stats every file, parses only the files the
cache (:mod:`~spawnkit.history.cache`) does not hold at their current size and mtime, adds
what ``spawnkit history import`` copied into the session store (:mod:`~spawnkit.history.
imported`), then builds the frames (:mod:`~spawnkit.history.transcript_frames`). The result,
:class:`Transcripts`, holds:

* ``sessions``: one row per session (the columns of :data:`SESSION_COLUMNS`);
* ``tool_calls``: one row per tool call, joinable on ``session_id``;
* ``usage``: one row per model response after deduplication, with its cost;
* ``events``: API errors, compactions, turn durations, rate-limit snapshots, skipped replays;
* ``files``: one row per file, with its count of unparseable lines (``bad_lines``) and the
  first of their line numbers, and for a file not read at all, why (``skip_reason``);
  nothing is printed and nothing is fatal.
"""

from __future__ import annotations

import functools
import gc
import shutil
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .cache import FileStat, RowCache, cache_dir, keep_paths, merge, unchanged
from .errors import HistoryError
from .formats import FORMATS, SOURCES, Source, SourceFormat, canonical
from .imported_files import imported_files
from .parquet import FRAMES, write_frame
from .pricing import PricingTable, default_pricing
from .rows import FileFacts, Rows, RowTables
from .transcript_frames import (
    EVENT_COLUMNS,
    SESSION_COLUMNS,
    TOOL_CALL_COLUMNS,
    build_frames,
    daily_totals,
)

MAX_FILE_BYTES = 2 << 30
CACHE_WRITE_TIMEOUT_S = 300.0
Reader = Callable[[FileStat], bytes]

__all__ = [
    "EVENT_COLUMNS",
    "SESSION_COLUMNS",
    "SOURCES",
    "TOOL_CALL_COLUMNS",
    "LoadStats",
    "Source",
    "Transcripts",
    "daily_totals",
    "local_machine",
    "transcripts",
]


def local_machine() -> str:
    """The name of this machine in the ``machine`` columns: its host name."""
    return socket.gethostname()


@dataclass(frozen=True)
class LoadStats:
    """What a load did: files seen, files parsed (not served from the cache), bytes parsed."""

    files: int
    parsed: int
    bytes_parsed: int
    bad_lines: int
    skipped: int = 0


@dataclass(frozen=True)
class Transcripts:
    """One source's history as DataFrames (see the module docstring)."""

    source: str
    roots: tuple[Path, ...]
    sessions: pd.DataFrame
    tool_calls: pd.DataFrame
    usage: pd.DataFrame
    events: pd.DataFrame
    files: pd.DataFrame
    stats: LoadStats

    def daily(self, tz: str = "UTC") -> pd.DataFrame:
        """Tokens and cost per calendar day in ``tz``, each response on its own day."""
        return daily_totals(self.usage, tz)

    @property
    def skipped(self) -> pd.DataFrame:
        """The files that were found but not read, with the reason."""
        return self.files.loc[self.files["skip_reason"].notna(), ["path", "skip_reason"]]

    def to_parquet(self, folder: str | Path) -> Path:
        """Write every frame as ``FRAME.parquet`` in ``folder`` (see :func:`~spawnkit.history.
        export.export` for a folder of several sources DuckDB reads as tables)."""
        out = Path(folder)
        for name in FRAMES:
            write_frame(getattr(self, name), out / f"{name}.parquet")
        return out


def transcripts(
    source: Source | str,
    root: str | Path | Sequence[str | Path] | None = None,
    *,
    pricing: PricingTable | None = None,
    cache: bool = True,
    workers: int | None = None,
    imported: bool | None = None,
    store: str | Path | None = None,
    machine: str | None = None,
) -> Transcripts:
    """Load a CLI's transcripts; ``root`` defaults to the CLI's own folders and spawnkit's.

    ``root`` is a Claude config folder (the one holding ``projects/``), a Codex home (holding
    ``sessions/``) or a Gemini home (holding ``tmp/``). ``imported`` adds the history that
    ``spawnkit history import`` copied into the store (``store``, default
    ``$SPAWNKIT_HOME/sessions.db``); by default it does when ``root`` is not given, so
    history outlives the CLI's own clean-ups. ``machine`` keeps only one machine's rows.
    With ``cache=False`` every file is parsed and nothing is written. ``workers`` processes
    parse large loads (default: one per core, at most 4, for loads over 32 MB; 1 parses in
    this process).
    """
    fmt = FORMATS[canonical(source)]
    if root is None:
        roots = fmt.default_roots()
    elif isinstance(root, str | Path):
        roots = [Path(root).expanduser()]
    else:
        roots = [Path(r).expanduser() for r in root]
    for r in roots:
        if not r.is_dir():
            raise HistoryError(f"no {fmt.name} transcripts folder at {r}")
    here = local_machine()
    rows = RowTables.empty()
    parsed = parsed_bytes = n_files = 0
    writes: list[threading.Thread] = []
    try:
        if machine in (None, here):
            for r in roots:
                part, stats = _load_root(fmt, r, cache, workers, writes)
                rows = merge(rows, part) if rows.files.num_rows else part
                parsed, parsed_bytes = parsed + stats[0], parsed_bytes + stats[1]
                n_files += part.files.num_rows
        if imported if imported is not None else root is None:
            part, stats = _load_imported(fmt, store, machine, here, roots, cache, writes)
            if part.files.num_rows:
                rows = merge(rows, part) if rows.files.num_rows else part
                parsed, parsed_bytes = parsed + stats[0], parsed_bytes + stats[1]
                n_files += part.files.num_rows
        frames = build_frames(fmt.name, rows, pricing or default_pricing(), here)
        files = frames["files"]
        stats_ = LoadStats(n_files, parsed, parsed_bytes, int(files["bad_lines"].sum()),
                           int(files["skip_reason"].notna().sum()))  # fmt: skip
        return Transcripts(fmt.name, tuple(roots), frames["sessions"], frames["tool_calls"],
                           frames["usage"], frames["events"], files, stats_)  # fmt: skip
    finally:
        for thread in writes:
            thread.join(CACHE_WRITE_TIMEOUT_S)


def _load_root(
    fmt: SourceFormat,
    root: Path,
    use_cache: bool,
    workers: int | None,
    writes: list[threading.Thread],
) -> tuple[RowTables, tuple[int, int]]:
    stats: list[FileStat] = []
    for path in fmt.discover(root):
        try:
            st = path.stat()
        except OSError:
            continue  # removed between listing and stat: it is no longer part of the history
        stats.append(FileStat(str(path), st.st_size, st.st_mtime_ns))
    store = RowCache(cache_dir(fmt.name, root)) if use_cache else None
    return load_cached(fmt, root, stats, store, workers, writes)


def _load_imported(
    fmt: SourceFormat,
    store: str | Path | None,
    machine: str | None,
    here: str,
    roots: Sequence[Path],
    use_cache: bool,
    writes: list[threading.Thread],
) -> tuple[RowTables, tuple[int, int]]:
    """The rows of what ``spawnkit history import`` copied into ``store`` for ``fmt``."""
    rows = RowTables.empty()
    parsed = parsed_bytes = 0
    for group in imported_files(fmt, store, machine, here, roots):
        key = group.cache_key
        cache = RowCache(cache_dir(f"imported-{fmt.name}", key)) if use_cache else None
        part, (n, size) = load_cached(
            fmt, group.root, list(group.stats), cache, None, writes, group.read
        )
        rows = merge(rows, part) if rows.files.num_rows else part
        parsed, parsed_bytes = parsed + n, parsed_bytes + size
    return rows, (parsed, parsed_bytes)


def load_cached(
    fmt: SourceFormat,
    root: Path,
    stats: list[FileStat],
    store: RowCache | None,
    workers: int | None,
    writes: list[threading.Thread],
    read: Reader | None = None,
) -> tuple[RowTables, tuple[int, int]]:
    """Rows of ``stats``: the cached rows of unchanged files, the others parsed."""
    cached = store.read() if store else None
    keep = unchanged(cached, stats) if cached is not None else set()
    todo = [s for s in stats if s.path not in keep]
    parsed = (len(todo), sum(s.size for s in todo))
    if cached is not None and not todo and len(keep) == cached.files.num_rows:
        return cached, (0, 0)
    if store is not None and not keep and todo:
        # Nothing to keep: the workers' files, if the load is shared out, become the cache.
        generation = store.new_generation()
        adopted = False
        try:
            fresh, runs = _parse(fmt, root, todo, workers, read, into=generation)
            if runs:
                adopted = store.adopt(generation, runs)
        finally:
            if not adopted:  # parsed here, failed or interrupted: written as usual, or not
                shutil.rmtree(generation, ignore_errors=True)
        if adopted:
            return fresh, parsed
    else:
        fresh = parse_files(fmt, root, todo, workers, read)
    rows = fresh if cached is None or not keep else merge(keep_paths(cached, keep), fresh)
    if store is not None:
        writes.append(store.write_in_background(rows))
    return rows, parsed


def parse_files(
    fmt: SourceFormat,
    root: Path,
    files: Sequence[FileStat],
    workers: int | None = None,
    read: Reader | None = None,
) -> RowTables:
    """Rows of ``files``, in their order; several worker processes for large loads of files
    on disk (``read`` reads files from elsewhere, in this process)."""
    return _parse(fmt, root, files, workers, read)[0]


def _parse(
    fmt: SourceFormat,
    root: Path,
    files: Sequence[FileStat],
    workers: int | None,
    read: Reader | None,
    into: Path | None = None,
) -> tuple[RowTables, list[str]]:
    """:func:`parse_files`, and with ``into`` the worker runs kept there for the cache (the
    names of their folders; none when the files were parsed in this process)."""
    if read is not None:
        return parse_serial(fmt.name, root, files, read), []
    # Imported here: the worker pool brings multiprocessing, asyncio and ssl (3 MB resident
    # in every process importing spawnkit.history, which a store's frames never need).
    from .workers import default_workers, parse_in_workers

    count = default_workers(sum(s.size for s in files)) if workers is None else workers
    if count > 1 and len(files) > 1:
        parse = functools.partial(parse_serial, fmt.name, root)
        return parse_in_workers(parse, files, [s.size for s in files], count, into)
    return parse_serial(fmt.name, root, files), []


def _read_file(stat: FileStat) -> bytes:
    if stat.size > MAX_FILE_BYTES:
        raise OSError(f"larger than {MAX_FILE_BYTES} bytes")
    return Path(stat.path).read_bytes()


def parse_serial(
    source: str, root: Path, files: Sequence[FileStat], read: Reader | None = None
) -> RowTables:
    """Parse ``files`` one after the other in this process (also a worker's job)."""
    # Parsing allocates a tuple or two per line and frees little until the end, so the
    # collector's passes over the growing row lists find nothing to free: about 5% of a
    # worker's parse of 100 MB. It is off while parsing and back as it was afterwards.
    with collector_paused():
        return _parse_serial(source, root, files, read)


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (as it was before, afterwards)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse_serial(
    source: str, root: Path, files: Sequence[FileStat], read: Reader | None
) -> RowTables:
    fmt = FORMATS[source]
    rows = Rows()
    for stat in files:
        session, project = fmt.identify(Path(stat.path), root)
        facts = FileFacts(stat.path, stat.size, stat.mtime_ns, session, project)
        rows.open_file()
        try:
            data = read(stat) if read is not None else _read_file(stat)
        except OSError as exc:
            facts.bad(0)  # line 0: the file itself could not be read
            facts.skip(f"cannot be read: {exc}")
        else:
            fmt.parse(data, facts, rows)
        rows.close_file(facts)
    return rows.tables()
