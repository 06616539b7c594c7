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
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from ..store import BUSY_TIMEOUT_MS, SessionStore
from ..store.sqlite import committed
from .errors import HistoryError
from .formats import FORMATS, SOURCES, SourceFormat, canonical, spawnkit_runtime_home
from .imported_files import SPAWNKIT_RUNS, import_store_file
from .transcript_loader import local_machine, transcripts

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


@contextmanager
def _writer(path: Path) -> Iterator[sqlite3.Connection]:
    """A write transaction on the store, migrated to the schema with the history tables."""
    SessionStore(path).close()
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("BEGIN IMMEDIATE")
        with committed(conn):
            yield conn
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
    the configured store (``$SPAWNKIT_STORE``, ``[store] url``, then
    ``$SPAWNKIT_HOME/sessions.db``), which must be a SQLite file.
    """
    names = list(SOURCES) if source is None else [source] if isinstance(source, str) else source
    fmts = [FORMATS[canonical(n)] for n in names]
    if root is not None and len(fmts) != 1:
        raise HistoryError("--root needs one --source (the folder is one CLI's)")
    name = _check_machine(machine or local_machine())
    path = import_store_file(store)
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
