"""History that outlives the CLIs: ``spawnkit history import`` copies transcripts into the store.

Claude Code deletes transcripts after 30 days by default, and a laptop's ``~/.codex`` dies
with the laptop. :func:`import_history` copies what a load reads into spawnkit's session
store, per machine: every file's raw lines (zlib-compressed, keyed by file and line number,
so a file that grew adds only its new lines) and its deduplicated usage rows, with their
cost (``history_usage``, for SQL). A later load (:func:`~spawnkit.history.transcripts`)
reads the imported files back as if they were still on disk, so the history stays
queryable after the CLI removed them; a file still on this machine's disk is read from disk.

Importing is idempotent per machine: the lines of a file are upserted by number, and the
usage rows of a (source, machine) pair are replaced by those of everything imported for it,
so importing machine A twice and machine B once gives exactly A's rows plus B's. Rows keep
their ``machine`` (``--machine NAME`` for a copied ``~/.claude`` of another computer; this
computer's host name by default). Responses with the same message id that two machines both
hold are still counted once by :func:`~spawnkit.history.transcripts`, which deduplicates
across files.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from ..home import default_store_path
from ..store import BUSY_TIMEOUT_MS, SessionStore
from .cache import FileStat, RowCache, cache_dir, merge
from .errors import HistoryError
from .formats import FORMATS, SOURCES, SourceFormat, canonical, spawnkit_runtime_home
from .rows import RowTables
from .store_query import read_only_uri

PREFIX = "imported:"  # the path of an imported file in frames: imported:MACHINE/PATH
SPAWNKIT_RUNS = "spawnkit-runs"  # files of spawnkit's own run homes, apart from the user's
_MACHINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_BATCH = 5000


@dataclass(frozen=True)
class ImportReport:
    """What one source's import did."""

    source: str
    machine: str
    files: int
    lines_added: int
    usage_rows: int
    skipped: tuple[tuple[str, str], ...]

    def line(self) -> str:
        skipped = f", {len(self.skipped)} skipped" if self.skipped else ""
        return (f"{self.source} ({self.machine}): {self.files} files, {self.lines_added} new "
                f"lines, {self.usage_rows} responses{skipped}")  # fmt: skip


def _check_machine(machine: str) -> str:
    if not _MACHINE.match(machine):
        raise HistoryError(
            f"bad machine name {machine!r}: letters, digits, '.', '_' and '-' (at most 64)"
        )
    return machine


def _relative(path: Path, root: Path, fmt: SourceFormat) -> str:
    """The path a file is stored under: relative to its root, spawnkit's runs apart."""
    relative = path.relative_to(root).as_posix()
    home = spawnkit_runtime_home(fmt.name)
    return f"{SPAWNKIT_RUNS}/{relative}" if home is not None and root == home else relative


def _disk_path(relative: str, roots: Sequence[Path], fmt: SourceFormat) -> Path | None:
    """Where an imported file of this machine lives on disk under ``roots``, if it does."""
    if relative.startswith(f"{SPAWNKIT_RUNS}/"):
        home = spawnkit_runtime_home(fmt.name)
        candidates = [home / relative.split("/", 1)[1]] if home is not None else []
    else:
        candidates = [root / relative for root in roots]
    return next((p for p in candidates if p.is_file()), None)


@contextmanager
def _writer(path: Path) -> Iterator[sqlite3.Connection]:
    """A write transaction on the store, migrated to the schema with the history tables."""
    SessionStore(path).close()
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()


def _line_hashes(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """``(number, hash, raw line)`` of every non-blank line (numbers are 1-based)."""
    out = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            out.append((number, hashlib.blake2b(raw, digest_size=16).digest(), raw))
    return out


def _store_file(conn: sqlite3.Connection, source: str, machine: str, relative: str,
                data: bytes, now: str) -> int:  # fmt: skip
    """Upsert one file's lines; the number of lines added or changed."""
    lines = _line_hashes(data)
    row = conn.execute(
        "SELECT id, version FROM history_files WHERE source = ? AND machine = ? AND path = ?",
        (source, machine, relative),
    ).fetchone()
    if row is None:
        file_id = conn.execute(
            "INSERT INTO history_files (source, machine, path, lines, bytes, version, "
            "imported_at) VALUES (?, ?, ?, ?, ?, 1, ?)",
            (source, machine, relative, len(lines), len(data), now),
        ).lastrowid
        known: dict[int, bytes] = {}
        assert file_id is not None
    else:
        file_id = row[0]
        query = "SELECT line, hash FROM history_lines WHERE file_id = ?"
        known = dict(conn.execute(query, (file_id,)).fetchall())
    changed = [(file_id, n, h, zlib.compress(raw, 1)) for n, h, raw in lines if known.get(n) != h]
    numbers = {n for n, _, _ in lines}
    gone = [(file_id, n) for n in known if n not in numbers]
    if changed or gone or row is None:
        conn.executemany("INSERT OR REPLACE INTO history_lines VALUES (?, ?, ?, ?)", changed)
        conn.executemany("DELETE FROM history_lines WHERE file_id = ? AND line = ?", gone)
        if row is not None:
            conn.execute(
                "UPDATE history_files SET lines = ?, bytes = ?, version = version + 1, "
                "imported_at = ? WHERE id = ?",
                (len(lines), len(data), now, file_id),
            )
    return len(changed)


def import_history(
    source: str | Iterable[str] | None = None,
    root: str | Path | None = None,
    *,
    machine: str | None = None,
    store: str | Path | None = None,
) -> list[ImportReport]:
    """Copy the transcripts of ``source`` (default: every source) into the session store.

    ``root`` is a CLI folder to read instead of the default ones (a copied ``~/.claude`` of
    another machine, with ``machine`` naming it); ``store`` defaults to
    ``$SPAWNKIT_HOME/sessions.db``.
    """
    from .transcript_loader import local_machine, transcripts

    names = list(SOURCES) if source is None else [source] if isinstance(source, str) else source
    fmts = [FORMATS[canonical(n)] for n in names]
    if root is not None and len(fmts) != 1:
        raise HistoryError("--root needs one --source (the folder is one CLI's)")
    name = _check_machine(machine or local_machine())
    path = Path(store) if store is not None else default_store_path()
    reports = []
    for fmt in fmts:
        roots = [Path(root).expanduser()] if root is not None else fmt.default_roots()
        for r in roots:
            if not r.is_dir():
                raise HistoryError(f"no {fmt.name} transcripts folder at {r}")
        now = datetime.now(UTC).isoformat()
        added = files = 0
        with _writer(path) as conn:
            for r in roots:
                for file in fmt.discover(r):
                    try:
                        data = file.read_bytes()
                    except OSError:
                        continue  # reported as skipped by the load below
                    added += _store_file(conn, fmt.name, name, _relative(file, r, fmt), data, now)
                    files += 1
        loaded = transcripts(fmt.name, [], imported=True, store=path, machine=name, cache=False)
        rows = _usage_rows(fmt.name, name, loaded.usage)
        with _writer(path) as conn:
            conn.execute("DELETE FROM history_usage WHERE source = ? AND machine = ?",
                         (fmt.name, name))  # fmt: skip
            conn.executemany(
                f"INSERT OR REPLACE INTO history_usage VALUES ({', '.join('?' * 15)})", rows
            )
        skipped = tuple(zip(loaded.skipped["path"], loaded.skipped["skip_reason"], strict=True))
        reports.append(ImportReport(fmt.name, name, files, added, len(rows), skipped))
    return reports


def _usage_rows(source: str, machine: str, usage: pd.DataFrame) -> list[tuple[object, ...]]:
    """The ``history_usage`` rows of a load's deduplicated usage."""

    def plain(value: Any) -> Any:
        if value is None or value is pd.NA or value is pd.NaT:
            return None
        if isinstance(value, float) and value != value:
            return None
        return value.item() if hasattr(value, "item") else value

    records: list[dict[str, Any]] = usage.to_dict(orient="records")  # type: ignore[assignment]
    rows: list[tuple[object, ...]] = []
    for r in records:
        when = r["timestamp"].isoformat()
        key = (f"{r['message_id']}|{r['request_id']}" if isinstance(r["message_id"], str)
               else f"{r['session_id']}|{when}|{len(rows)}")  # fmt: skip
        rows.append(tuple(plain(v) for v in (
            source, machine, key, str(r["session_id"]), when, r["model"], r["input_tokens"],
            r["output_tokens"], r["thinking_tokens"], r["cache_write_tokens"],
            r["cache_read_tokens"], r["cost_usd"], str(r["cost_source"]),
            int(bool(r["cost_estimated"])), int(bool(r["is_sidechain"])),
        )))  # fmt: skip
    return rows


def imported_rows(
    fmt: SourceFormat,
    store: str | Path | None,
    machine: str | None,
    here: str,
    roots: Sequence[Path],
    use_cache: bool,
    writes: list[threading.Thread],
) -> tuple[RowTables, tuple[int, int]]:
    """The rows of the files imported for ``fmt`` (one ``machine``, or all), parsed from the
    store; a file of this machine that is still on disk under ``roots`` is left to the disk."""
    from .transcript_loader import load_cached

    path = Path(store) if store is not None else default_store_path()
    if not path.exists():
        if store is not None:
            raise HistoryError(f"no session store at {path}")
        return RowTables.empty(), (0, 0)
    with closing(sqlite3.connect(read_only_uri(path), uri=True)) as conn:
        try:
            found = conn.execute(
                "SELECT id, machine, path, bytes, version FROM history_files WHERE source = ?"
                + (" AND machine = ?" if machine else "")
                + " ORDER BY machine, path",
                (fmt.name, machine) if machine else (fmt.name,),
            ).fetchall()
        except sqlite3.OperationalError:
            return RowTables.empty(), (0, 0)  # a store older than the history tables
    ids: dict[str, int] = {}
    by_machine: dict[str, list[FileStat]] = {}
    for file_id, owner, relative, size, version in found:
        if owner == here and _disk_path(relative, roots, fmt) is not None:
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

    rows = RowTables.empty()
    parsed = parsed_bytes = 0
    for owner, stats in by_machine.items():
        # Each machine's files are read as if under a root of their own.
        key = Path(f"{path.resolve()}#{owner}")
        cache = RowCache(cache_dir(f"imported-{fmt.name}", key)) if use_cache else None
        part, (n, size) = load_cached(fmt, Path(f"{PREFIX}{owner}"), stats, cache, None, writes,
                                      read)  # fmt: skip
        rows = merge(rows, part) if rows.files.num_rows else part
        parsed, parsed_bytes = parsed + n, parsed_bytes + size
    return rows, (parsed, parsed_bytes)


def machine_of(path: str, here: str) -> str:
    """The machine a file's rows come from: named in an imported path, else this one."""
    return path[len(PREFIX) :].split("/", 1)[0] if path.startswith(PREFIX) else here
