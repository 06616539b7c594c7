"""Queries on the session store as Arrow tables, with one SQLite library per process.

The store (:mod:`spawnkit.store`) is written through Python's ``sqlite3``. Reading it with a
second SQLite library in the same process (the ADBC driver bundles its own) is the hazard
SQLite's documentation warns about: closing a connection of one library drops the POSIX
locks the other library holds on the same file, so another process believes it is alone,
checkpoints and deletes the live WAL, and the store is corrupted. So:

* small stores are read in this process through ``sqlite3`` itself (the same library as the
  store's writers, so its lock bookkeeping is shared), and the rows are turned into Arrow;
* large stores are read by the ADBC driver in a child process
  (:mod:`spawnkit.history._sqlite_arrow`), which streams Arrow IPC back over a pipe. The
  child has locks of its own, costs a fixed ~0.3 s to start, and is about four times faster
  per row than building Python rows, so it pays off from :data:`CHILD_MIN_BYTES` on.

Both paths run the same SQL and give tables that :func:`spawnkit.history.store_frames`
retypes the same way. The child is bounded by :data:`QUERY_TIMEOUT_S` and killed on any
exit of the caller (an interrupt included); if the caller's process dies, the child gets a
broken pipe and ends.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from io import IOBase
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import pyarrow as pa

from ..errors import SpawnkitError
from ..home import is_writable
from ..store.schema import SCHEMA as STORE_SCHEMA
from ..store.sqlite import damage_error
from .errors import HistoryError

CHILD_MIN_BYTES = 24 << 20
# Rows that cost less to build in this process than a child costs to start (~0.3 s).
SMALL_ROWS = 20_000
QUERY_TIMEOUT_S = 900.0
_CHILD_SCRIPT = Path(__file__).with_name("_sqlite_arrow.py")


def read_only_uri(path: Path) -> str:
    """A read-only URI; immutable in a folder nobody can write to (a read-only home).

    SQLite cannot create the WAL index (``-shm``) next to a store in a read-only folder,
    so a plain read-only open fails there; nothing can change such a file, so reading it
    as immutable is safe.
    """
    uri = f"file:{quote(path.as_posix())}?mode=ro"
    return uri if is_writable(path.parent) else uri + "&immutable=1"


def store_bytes(path: Path) -> int:
    """The store's size on disk, its write-ahead log included."""
    size = 0
    for part in (path, path.with_name(path.name + "-wal")):
        try:
            size += part.stat().st_size
        except FileNotFoundError:
            continue
    return size


def query(
    path: Path | None, sql: str, params: Sequence[object] = (), *, small: bool = False
) -> pa.Table:
    """Run ``sql`` read-only on the store at ``path`` (None: an empty store of today's schema).

    ``small``: the answer is known to be a few rows (:data:`SMALL_ROWS` at most), read in
    this process however large the store: a child costs more to start than they take."""
    if path is None:
        return _in_process(None, sql, params)
    if not small and store_bytes(path) >= CHILD_MIN_BYTES:
        return _in_child(path, sql, params)
    return _in_process(path, sql, params)


def count(path: Path, table: str, where: str, params: Sequence[object]) -> int:
    """How many rows of ``table`` match ``where`` (read in this process: it is one number)."""
    found = _in_process(path, f"SELECT count(*) AS n FROM {table}{where}", params)["n"]
    return int(found[0].as_py())


def table_columns(path: Path | None, table: str) -> list[str]:
    """The column names of ``table`` (always read in this process: it is one tiny query)."""
    names = _in_process(path, "SELECT name FROM pragma_table_info(?)", [table])["name"]
    return [str(name) for name in names.to_pylist()]


def _in_process(path: Path | None, sql: str, params: Sequence[object]) -> pa.Table:
    try:
        if path is None:
            conn = sqlite3.connect(":memory:")
            conn.executescript(STORE_SCHEMA)
        else:
            conn = sqlite3.connect(read_only_uri(path), uri=True)
    except sqlite3.Error as exc:
        raise _read_error(path, "open", str(exc)) from exc
    try:
        cursor = conn.execute(sql, tuple(params))
        names = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
    except sqlite3.Error as exc:
        raise _read_error(path, "read", str(exc)) from exc
    finally:
        conn.close()
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    return pa.table([_array(values) for values in columns], names=names)


def _array(values: Sequence[object]) -> pa.Array[Any]:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # SQLite's columns are dynamically typed; a column mixing text and numbers is text.
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def _in_child(path: Path, sql: str, params: Sequence[object]) -> pa.Table:
    request = json.dumps({"sql": sql, "params": list(params)}).encode()
    proc = subprocess.Popen(
        [sys.executable, "-I", str(_CHILD_SCRIPT), read_only_uri(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        proc.stdin.write(request)
        proc.stdin.close()
        table: pa.Table | None
        try:
            # A pipe is a binary file object; pyarrow's stubs only name IOBase.
            table = pa.ipc.open_stream(cast(IOBase, proc.stdout)).read_all()
        except pa.ArrowInvalid:
            table = None  # the child failed before writing a stream; its stderr says why
        code = proc.wait(timeout=QUERY_TIMEOUT_S)
        error = proc.stderr.read().decode(errors="replace").strip()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
    if code != 0 or table is None:
        detail = error.splitlines()[-1] if error else f"the reader exited with code {code}"
        raise _read_error(path, "read", detail)
    return table


def _read_error(path: Path | None, doing: str, detail: str) -> SpawnkitError:
    """A damaged file is :class:`~spawnkit.errors.StoreDamaged`, with the way out the
    command line gives (``spawnkit store check --repair``); anything else a HistoryError."""
    damaged = damage_error(path, detail) if path is not None else None
    return damaged or HistoryError(f"cannot {doing} the session store {path}: {detail}")
