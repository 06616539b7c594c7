"""A columnar cache of the store's completed sessions and tool calls, keyed on its watermark.

Reading a million sessions or ten million tool calls out of SQLite takes seconds however it
is done (every value crosses SQLite's row API, and timestamps are text). But the store only
ever appends history: a session row is completed once and never changes after, and its tool
calls are written with it. So this module keeps, per store, the typed Arrow columns of the
completed sessions and of the tool calls up to a *watermark* (the largest ``rowid`` read),
memory-mapped from ``$SPAWNKIT_HOME/history-cache/store-<hash>/``, and each read only asks
SQLite for the rows after the watermark (plus the sessions that were still open when the
cache was written, which are read again until they complete).

The cache is trusted only while the store says nothing changed behind it: schema 5 keeps a
random ``token`` per store (a store deleted and made again gets a new one) and an ``epoch``
that triggers bump whenever a completed session or a tool call is updated or deleted
(:mod:`spawnkit.store`). Any difference, a missing or damaged file, or an older format, and
the cache is rebuilt from a full read. Files are written to a temporary name and renamed,
so a reader never sees half a file, and never overwritten in place (a mapped file that is
truncated under its reader crashes it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import uuid
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..home import spawnkit_home
from .arrow_frames import release_memory
from .store_query import read_only_uri

FORMAT = "spawnkit-store-cache-1"
ROWID = "_rowid"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreState:
    """What identifies the store's history now: token, epoch and the largest rowids."""

    token: str
    epoch: int
    max_session: int
    max_call: int


def store_state(path: Path) -> StoreState | None:
    """The store's state, or None for a store without the history tables (older schema)."""
    try:
        with closing(sqlite3.connect(read_only_uri(path), uri=True)) as conn:
            row = conn.execute(
                "SELECT token, epoch, (SELECT max(rowid) FROM sessions), "
                "(SELECT max(rowid) FROM tool_calls) FROM history_epoch WHERE id = 1"
            ).fetchone()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    return StoreState(str(row[0]), int(row[1]), int(row[2] or 0), int(row[3] or 0))


@dataclass(frozen=True)
class Cached:
    """One cached table and what it covers: rows up to ``watermark``, except ``open``."""

    table: pa.Table
    watermark: int
    open: tuple[int, ...]


class StoreCache:
    """The cached tables of one store."""

    def __init__(self, store: Path) -> None:
        digest = hashlib.sha256(str(store.resolve()).encode()).hexdigest()[:16]
        self.directory = spawnkit_home() / "history-cache" / f"store-{digest}"

    def read(self, kind: str, state: StoreState, schema: pa.Schema) -> Cached | None:
        """The cached ``kind`` table if it belongs to this store as it is now."""
        found = load_matching(
            self.directory / f"{kind}.arrow", schema,
            format=FORMAT, token=state.token, epoch=state.epoch,
        )  # fmt: skip
        if found is None:
            return None
        table, info = found
        return Cached(table, int(info["watermark"]), tuple(info.get("open", ())))

    def write(self, kind: str, state: StoreState, cached: Cached) -> None:
        """Replace the cached ``kind`` table (a failed write is logged and leaves the old)."""
        info = {"format": FORMAT, "token": state.token, "epoch": state.epoch,
                "watermark": cached.watermark, "open": list(cached.open)}  # fmt: skip
        save_table(self.directory, kind, cached.table, info)


def load_matching(
    path: Path, schema: pa.Schema, **expected: object
) -> tuple[pa.Table, dict[str, Any]] | None:
    """:func:`load_table`, if what was said about the table has every ``expected`` value
    (its format, the store it came from as it is now) and it has ``schema``."""
    found = load_table(path)
    if found is None:
        return None
    table, info = found
    if any(info.get(key) != value for key, value in expected.items()):
        return None
    if table.schema != schema:
        return None  # written by another version of the columns
    return table, info


def load_table(path: Path) -> tuple[pa.Table, dict[str, Any]] | None:
    """A table written by :func:`save_table`, memory-mapped, and what was said about it."""
    try:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowInvalid) as exc:
        log.warning("ignoring the unreadable history cache %s: %s", path, exc)
        return None
    meta = table.schema.metadata or {}
    try:
        info = json.loads(meta[b"spawnkit"])
    except (KeyError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    return table.replace_schema_metadata(None), info


def save_table(directory: Path, kind: str, table: pa.Table, info: dict[str, Any]) -> None:
    """``table`` as ``directory/kind.arrow`` with ``info``, written aside and renamed (a failed
    write is logged and leaves the old file)."""
    # An IPC file holds one dictionary per column: chunks read at different times share it.
    table = table.unify_dictionaries()
    table = table.replace_schema_metadata({b"spawnkit": json.dumps(info).encode()})
    final = directory / f"{kind}.arrow"
    tmp = final.with_name(f".{kind}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=1 << 20)
        tmp.replace(final)
    except OSError as exc:
        log.warning("could not write the history cache %s: %s", final, exc)
    finally:
        tmp.unlink(missing_ok=True)
        del table  # the unified copy of the name columns
        release_memory()  # and what it held: not resident under the frame
