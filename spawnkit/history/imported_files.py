"""Reading back what ``spawnkit history import`` copied into the session store.

An imported file appears in frames under a path of its own, ``imported:MACHINE/PATH``
(:data:`PREFIX`), so rows keep the machine they came from (:func:`machine_of`). The loader
(:mod:`~spawnkit.history.transcript_loader`) asks :func:`imported_files` which files the
store holds for a source and parses them as if they lay under a root of their own; the
write side, :func:`~spawnkit.history.imported.import_history`, sits above the loader.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from ..home import default_store_path, store_setting
from ..store import is_postgres_url
from ..store.backend import redact_url
from .cache import FileStat
from .errors import HistoryError
from .formats import SourceFormat, spawnkit_runtime_home
from .store_query import read_only_uri

PREFIX = "imported:"  # the path of an imported file in frames: imported:MACHINE/PATH
SPAWNKIT_RUNS = "spawnkit-runs"  # files of spawnkit's own run homes, apart from the user's


@dataclass(frozen=True)
class ImportedFiles:
    """The files imported for one machine, read from the store as if under ``root``."""

    machine: str
    root: Path
    # What the row cache of these files is keyed by: the store and the machine.
    cache_key: Path
    stats: tuple[FileStat, ...]
    read: Callable[[FileStat], bytes]


def configured_import_store() -> Path | str:
    """The store imported transcripts live in when none is named: the configured one
    (``$SPAWNKIT_STORE`` or ``--store``, ``[store] url``, then ``$SPAWNKIT_HOME/sessions.db``);
    a PostgreSQL URL when that is a server, which holds none."""
    chosen = store_setting()
    if chosen is None:
        return default_store_path()
    return chosen if is_postgres_url(chosen) else Path(chosen).expanduser()


def import_store_file(store: str | Path | None) -> Path:
    """The SQLite file ``history import`` writes to: ``store``, else the configured store,
    which must then be a file (imported transcripts are kept in SQLite only)."""
    chosen = Path(store) if store is not None else configured_import_store()
    if isinstance(chosen, str):
        raise HistoryError(
            "history import keeps transcripts in a SQLite store, and the configured store is "
            f"the PostgreSQL server {redact_url(chosen)}: give a file with --store PATH"
        )
    return chosen


def disk_path(relative: str, roots: Sequence[Path], fmt: SourceFormat) -> Path | None:
    """Where an imported file of this machine lives on disk under ``roots``, if it does."""
    if relative.startswith(f"{SPAWNKIT_RUNS}/"):
        home = spawnkit_runtime_home(fmt.name)
        candidates = [home / relative.split("/", 1)[1]] if home is not None else []
    else:
        candidates = [root / relative for root in roots]
    return next((p for p in candidates if p.is_file()), None)


def imported_files(
    fmt: SourceFormat,
    store: str | Path | None,
    machine: str | None,
    here: str,
    roots: Sequence[Path],
) -> list[ImportedFiles]:
    """The files imported for ``fmt`` (one ``machine``, or all), by machine; a file of this
    machine that is still on disk under ``roots`` is left to the disk."""
    chosen = Path(store) if store is not None else configured_import_store()
    if isinstance(chosen, str):
        return []  # a server: history import never writes there
    path = chosen
    if not path.exists():
        if store is not None:
            raise HistoryError(f"no session store at {path}")
        return []
    with closing(sqlite3.connect(read_only_uri(path), uri=True)) as conn:
        try:
            found = conn.execute(
                "SELECT id, machine, path, bytes, version FROM history_files WHERE source = ?"
                + (" AND machine = ?" if machine else "")
                + " ORDER BY machine, path",
                (fmt.name, machine) if machine else (fmt.name,),
            ).fetchall()
        except sqlite3.OperationalError:
            return []  # a store older than the history tables
    ids: dict[str, int] = {}
    by_machine: dict[str, list[FileStat]] = {}
    for file_id, owner, relative, size, version in found:
        if owner == here and disk_path(relative, roots, fmt) is not None:
            continue
        virtual = f"{PREFIX}{owner}/{relative}"
        ids[virtual] = file_id
        by_machine.setdefault(owner, []).append(FileStat(virtual, size, version))

    def read(stat: FileStat) -> bytes:
        with closing(sqlite3.connect(read_only_uri(path), uri=True)) as conn:
            lines = conn.execute(
                "SELECT line, raw FROM history_lines WHERE file_id = ? ORDER BY line",
                (ids[stat.path],),
            ).fetchall()
        out: list[bytes] = []
        for number, raw in lines:
            out.extend([b""] * (number - 1 - len(out)))  # blank lines keep line numbers
            out.append(zlib.decompress(raw))
        return b"\n".join(out)

    key = path.resolve()
    return [
        ImportedFiles(owner, Path(f"{PREFIX}{owner}"), Path(f"{key}#{owner}"), tuple(stats), read)
        for owner, stats in by_machine.items()
    ]


def machine_of(path: str, here: str) -> str:
    """The machine a file's rows come from: named in an imported path, else this one."""
    return path[len(PREFIX) :].split("/", 1)[0] if path.startswith(PREFIX) else here
