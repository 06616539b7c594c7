"""The SQLite store's own columnar copy of its history (spawnkit/store/segments.py).

Runs completed through ``SessionStore`` seal their sessions and tool calls into segments;
``history.sessions()`` / ``tool_calls()`` then read those plus the few rows after them, in
any ``$SPAWNKIT_HOME`` (no cache of its own), and give exactly the frames of the rows
(``cache=False``). What is checked is what runs: which queries, which processes, which
modules, never how fast.
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from spawnkit import history
from spawnkit.history import store_query
from spawnkit.result import SpawnerResult, ToolCall
from spawnkit.store import SessionStore, segments
from spawnkit.store import session_store as session_store_module

from .conftest import REPO
from .test_history_store import T0, record

SEAL = 3  # sessions between two seals here


@pytest.fixture
def small_seals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_store_module, "SEAL_SESSIONS", SEAL)
    monkeypatch.setattr(segments, "SEAL_SESSIONS", SEAL)


@pytest.fixture
def store(tmp_path: Path, small_seals: None) -> Iterator[SessionStore]:
    with SessionStore(tmp_path / "sessions.db") as opened:
        yield opened


def runs(store: SessionStore, n: int, start: int = 0, calls: int = 2) -> None:
    for i in range(start, start + n):
        record(store, f"s{i:03d}", butler=("health", "general")[i % 2], calls=calls,
               at=T0 + timedelta(minutes=i))  # fmt: skip


def sealed(store: SessionStore) -> list[tuple[int, int, int]]:
    """(hi, level, sessions) of each segment."""
    assert store.path is not None
    with sqlite3.connect(store.path) as conn:
        return conn.execute(
            "SELECT hi, level, n_sessions FROM history_segments ORDER BY hi"
        ).fetchall()


def epoch(store: SessionStore) -> int:
    assert store.path is not None
    with sqlite3.connect(store.path) as conn:
        return int(conn.execute("SELECT epoch FROM history_epoch").fetchone()[0])


def assert_frames_are_the_rows(store: SessionStore, **filters: object) -> None:
    for read in (history.sessions, history.tool_calls):
        got = read(store, cache=True, **filters)  # type: ignore[operator]
        want = read(store, cache=False, **filters)  # type: ignore[operator]
        pd.testing.assert_frame_equal(got, want)


def test_completed_runs_are_sealed_and_read_from_their_segments(
    store: SessionStore, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs(store, 2 * SEAL + 1)
    assert [(hi, n) for hi, _, n in sealed(store)] == [(SEAL, SEAL), (2 * SEAL, SEAL)]
    want = (history.sessions(store, cache=False), history.tool_calls(store, cache=False))
    monkeypatch.setattr(store_query, "CHILD_MIN_BYTES", 0)  # every store counts as large
    monkeypatch.setattr(store_query, "_in_child", lambda *a: pytest.fail("read the rows"))
    got = (history.sessions(store, cache=True), history.tool_calls(store, cache=True))
    pd.testing.assert_frame_equal(got[0], want[0])
    pd.testing.assert_frame_equal(got[1], want[1])
    assert len(got[1]) == 2 * (2 * SEAL + 1)
    assert not (isolated_home / "history-cache").exists()  # nothing kept per home


def test_live_tool_calls_and_their_replacement_leave_the_copy_current(
    store: SessionStore,
) -> None:
    """A run's calls are written as they start and end, then replaced by its result's:
    none of that touches what is sealed (before schema 16 each bumped the epoch)."""
    runs(store, SEAL)
    before = epoch(store)
    store.create_session("live", butler="health", runtime="claude-code", model=None,
                         prompt="p", context=None, trigger_source="external",
                         created_at=T0 + timedelta(hours=1))  # fmt: skip
    call = ToolCall.start("t1", "Bash", {"cmd": "ls"}, T0 + timedelta(hours=1))
    assert store.record_tool_call("live", 0, call)
    assert store.record_tool_call("live", 0, call.finish("ok", False, T0 + timedelta(hours=1)))
    done = call.finish("ok", False, T0 + timedelta(hours=1, seconds=1))
    store.complete_session("live", SpawnerResult(output="x", success=True, session_id="live",
                                                 status="success", tool_calls=[done]))  # fmt: skip
    assert epoch(store) == before
    assert_frames_are_the_rows(store)


def test_open_runs_are_sealed_once_they_complete(store: SessionStore) -> None:
    store.create_session("waits", butler="health", runtime="codex", model=None, prompt="p",
                         context=None, trigger_source="external", created_at=T0)  # fmt: skip
    runs(store, SEAL, start=1)
    assert sealed(store)[-1][2] == SEAL - 1  # the open one is left out ...
    assert_frames_are_the_rows(store)
    store.complete_session("waits", SpawnerResult(output="x", success=True, session_id="waits",
                                                  status="success"))  # fmt: skip
    runs(store, SEAL, start=SEAL + 1)
    assert sum(n for _, _, n in sealed(store)) == 2 * SEAL  # ... and sealed later
    assert store.path is not None
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("SELECT open FROM history_segments ORDER BY hi DESC").fetchone() == (
            "[]",
        )
    assert_frames_are_the_rows(store)
    assert_frames_are_the_rows(store, butler="health", since=T0 + timedelta(minutes=2))


def test_segments_merge_and_keep_call_order(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments, "FANOUT", 2)
    store.create_session("late", butler="health", runtime="codex", model=None, prompt="p",
                         context=None, trigger_source="external", created_at=T0)  # fmt: skip
    store.record_tool_call("late", 0, ToolCall.start("x", "Bash", {}, T0))  # an early rowid
    runs(store, 4 * SEAL, start=1)
    store.complete_session("late", SpawnerResult(output="x", success=True, session_id="late",
                                                 status="success"))  # fmt: skip
    runs(store, 4 * SEAL, start=4 * SEAL + 1)
    levels = [level for _, level, _ in sealed(store)]
    assert max(levels) == segments.MAX_LEVEL and len(levels) < 8 * 2
    assert_frames_are_the_rows(store)


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE sessions SET butler = 'renamed' WHERE id = 's001'",
        "DELETE FROM sessions WHERE id = 's002'",
        "DELETE FROM tool_calls WHERE session_id = 's000'",
        "UPDATE tool_calls SET status = 'error' WHERE session_id = 's004'",
    ],
)
def test_a_change_to_sealed_history_is_read_and_resealed(store: SessionStore, change: str) -> None:
    runs(store, 2 * SEAL)
    before = epoch(store)
    assert store.path is not None
    with sqlite3.connect(store.path) as conn:
        conn.execute(change)
    assert epoch(store) > before
    # The stale copy is read again in full, once, and sealed afresh (orphaned calls too).
    assert_frames_are_the_rows(store)
    first = sealed(store)
    assert first and sum(n for _, _, n in first) == len(history.sessions(store, cache=False))


def test_a_store_written_before_segments_is_sealed_on_its_first_read(
    tmp_path: Path, small_seals: None
) -> None:
    path = tmp_path / "old.db"
    with SessionStore(path) as store:
        runs(store, SEAL - 1)  # too few to seal: as rows an older spawnkit wrote
        assert sealed(store) == []
        assert_frames_are_the_rows(store)  # one full read, which seals them
        assert sum(n for _, _, n in sealed(store)) == SEAL - 1
        assert_frames_are_the_rows(store)


def test_a_read_only_store_without_segments_is_read_through_the_home_cache(
    tmp_path: Path, isolated_home: Path, small_seals: None
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    with SessionStore(folder / "s.db") as store:
        runs(store, SEAL - 1)
    folder.chmod(0o555)
    (folder / "s.db").chmod(0o444)
    try:
        if os.access(folder / "s.db", os.W_OK):
            pytest.skip("root writes read-only files")
        assert len(history.sessions(folder / "s.db", cache=True)) == SEAL - 1
        assert (isolated_home / "history-cache").is_dir()
    finally:
        folder.chmod(0o755)


def test_two_processes_completing_runs_on_one_store(tmp_path: Path) -> None:
    """Two writers seal concurrently: every session once, frames equal to the rows."""
    path = tmp_path / "shared.db"
    SessionStore(path).close()
    script = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from datetime import timedelta
from spawnkit.store import SessionStore, segments, session_store
session_store.SEAL_SESSIONS = segments.SEAL_SESSIONS = {SEAL}
from tests.test_history_store import T0, record
with SessionStore({str(path)!r}) as store:
    for i in range(20):
        record(store, sys.argv[1] + str(i), butler="health", at=T0 + timedelta(seconds=i))
"""
    writers = [
        subprocess.Popen([sys.executable, "-c", script, name], stderr=subprocess.PIPE)
        for name in ("p", "q")
    ]
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err.decode()[-2000:]
    with SessionStore(path) as store:
        assert len(history.sessions(store, cache=False)) == 40
        assert sum(n for _, _, n in sealed(store)) >= 40 - SEAL
        assert_frames_are_the_rows(store)


def test_the_reader_child_imports_no_pandas(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "s.db") as store:
        record(store, "a", butler="health")
    script = REPO / "spawnkit" / "history" / "_sqlite_arrow.py"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-I", str(script),
         store_query.read_only_uri(tmp_path / "s.db")],
        input=b'{"sql": "SELECT id FROM sessions WHERE butler = ? AND rowid > ?", '
        b'"params": ["health", 0]}',
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()}
    assert "pyarrow" in imported and "adbc_driver_sqlite" in imported
    assert not {name for name in imported if name.split(".")[0] == "pandas"}
    import pyarrow as pa

    assert pa.ipc.open_stream(done.stdout).read_all().to_pylist() == [{"id": "a"}]


def test_a_repaired_store_carries_no_segments_over(tmp_path: Path, small_seals: None) -> None:
    """Repair renumbers rowids and may lose rows: segments naming the old ones would give
    frames that are not the rows. They are made again from the repaired rows."""
    from spawnkit.store.repair import repair_store

    from .test_store_safety import _damage

    db = tmp_path / "sessions.db"
    with SessionStore(db) as store:
        runs(store, 40, calls=20)
        assert sealed(store)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _damage(db)
    report = repair_store(db)
    assert report.backup is not None
    with SessionStore(db) as store:
        assert sealed(store) == []
        assert_frames_are_the_rows(store)  # the first read seals the repaired rows
        assert sealed(store)
        assert_frames_are_the_rows(store)


def test_a_sqlite_store_is_read_without_the_server_driver(tmp_path: Path) -> None:
    """Reading a SQLite store's frames imports no psycopg (its server stack is 10 MB of the
    reading process and a tenth of a CPU-second before the first row)."""
    with SessionStore(tmp_path / "s.db") as store:
        runs(store, 3)
    script = (
        "import sys\nfrom spawnkit import history\n"
        f"assert len(history.tool_calls({str(tmp_path / 's.db')!r}, cache=True)) == 6\n"
        f"assert len(history.sessions({str(tmp_path / 's.db')!r}, cache=True)) == 3\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        check=False, cwd=REPO, env={**os.environ, "SPAWNKIT_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_each_column_s_arrow_memory_is_given_back_before_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handed table becomes pandas a column at a time: when the last column is converted,
    the Arrow buffers of the others are gone (to_pandas on the whole table held them all,
    and a read peaked at the table plus the frame)."""
    import numpy as np
    import pyarrow as pa

    from spawnkit.history import arrow_frames

    pool = pa.system_memory_pool()  # where the segments are decoded
    rows = 1 << 20
    names = [f"n{i}" for i in range(4)]
    start = pool.bytes_allocated()
    table = pa.table({name: pa.array(np.arange(rows), memory_pool=pool) for name in names})
    # pa.array of numpy is zero-copy: give the table Arrow buffers of its own, in the pool.
    table = pa.Table.from_arrays([pc_copy(c, pool) for c in table.columns], names=names)
    held: list[int] = []
    convert = arrow_frames._series

    def observed(name: str, column: object, release: object) -> object:
        held.append(pool.bytes_allocated() - start)
        return convert(name, column, release)

    monkeypatch.setattr(arrow_frames, "_series", observed)
    handed = arrow_frames.Handed(table)
    del table
    frame = arrow_frames.frame(handed, names)
    column_bytes = rows * 8
    assert held[0] >= 4 * column_bytes  # the whole table, before the first column
    assert held[-1] <= 1.5 * column_bytes  # the last column alone (and no pandas copies)
    assert list(frame["n3"].iloc[[0, -1]]) == [0, rows - 1] and str(frame["n3"].dtype) == "Int64"


def test_integer_and_boolean_columns_convert_as_pandas_would() -> None:
    """``Int64`` and ``boolean`` columns are copied out of Arrow's buffers by numpy (chunks
    sliced at any bit, nulls, empty chunks), giving what ``to_pandas`` gives, and nothing
    is allocated in Arrow's C++ default pool (pandas' conversion unpacked bits there)."""
    import pyarrow as pa

    from spawnkit.history import arrow_frames

    ints = [pa.array([1, None, 3, 4, None], pa.int64()).slice(1), pa.array([], pa.int64()),
            pa.array([None, 7, 8, 2**62], pa.int64())]  # fmt: skip
    bools = [pa.array([True, None, False, True, False, None, True, True, False]).slice(2, 5),
             pa.array([], pa.bool_()), pa.array([True, None, False])]  # fmt: skip
    table = pa.table({"n": pa.chunked_array(ints), "ok": pa.chunked_array(bools)})
    types = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    want = table.to_pandas(types_mapper=types.get)
    default = pa.default_memory_pool()
    before = default.num_allocations()
    got = arrow_frames.frame(arrow_frames.Handed(table), ["n", "ok"])
    pd.testing.assert_frame_equal(got, want)
    if default.backend_name != "system":
        assert default.num_allocations() == before


# Freed heap chunks pinned between live ones, then release_memory: what stays resident.
_TRIM_PROBE = """
import json, numpy as np
from spawnkit.history.arrow_frames import release_memory
def rss():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS:")][0].split()[1])
pieces = []
for _ in range(1500):  # 96 KB each, under malloc's mmap threshold: in the heap
    pieces.append(np.ones(12_000))
    pieces.append(np.ones(256))  # a small live chunk after each: the heap cannot shrink
del pieces[::2]
freed = rss()
release_memory()
print(json.dumps({"freed": freed, "released": rss()}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_release_memory_gives_freed_heap_pages_back() -> None:
    """What a read frees between chunks still in use stays resident until it is trimmed,
    and a read's peak RSS (at its end, the frame whole) kept it: Arrow's system pool's
    ``release_unused`` did not trim. ``release_memory`` does."""
    done = subprocess.run([sys.executable, "-c", _TRIM_PROBE], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    kb = json.loads(done.stdout.strip().splitlines()[-1])
    assert kb["freed"] - kb["released"] >= 100 * 1024  # of 140 MB freed


def pc_copy(column: object, pool: object) -> object:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.add(column, pa.scalar(0, pa.int64()), memory_pool=pool)
