"""The PostgreSQL store's own columnar copy of its history (spawnkit/store/server_segments.py).

Every test runs on a real server (tests/postgres.py). Runs completed through
``SessionStore`` queue their sessions, and every ``SEAL_SESSIONS`` of them are sealed with
their tool calls into a segment; ``history.sessions()`` / ``tool_calls()`` then read the
segments plus the rows not sealed yet, in any ``$SPAWNKIT_HOME``, and give exactly the
frames of the rows (``cache=False``). What is checked is what runs (which rows a read
took, what the server holds), never how fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pytest

from spawnkit import history
from spawnkit.history import server_query, store_query
from spawnkit.result import SpawnerResult
from spawnkit.store import SessionStore, server_segments
from spawnkit.store import session_store as session_store_module

from .test_history_store import T0, record

SEAL = 3  # sessions between two seals here


@pytest.fixture
def small_seals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_store_module, "SEAL_SESSIONS", SEAL)
    monkeypatch.setattr(server_segments, "SEAL_SESSIONS", SEAL)


@pytest.fixture
def store(postgres_url: str, small_seals: None) -> Iterator[SessionStore]:
    with SessionStore(postgres_url) as opened:
        yield opened


def runs(store: SessionStore, ids: list[str], start: int = 0, calls: int = 2) -> None:
    for n, sid in enumerate(ids, start):
        record(store, sid, butler=("health", "general")[n % 2], calls=calls,
               at=T0 + timedelta(minutes=n))  # fmt: skip


def server(url: str) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET search_path TO spawnkit")
    return conn


def sealed(url: str) -> list[tuple[int, int]]:
    """(level, sessions) of each segment, oldest first."""
    with server(url) as conn:
        rows = conn.execute("SELECT level, n_sessions FROM history_segments ORDER BY id")
        return [(int(level), int(n)) for level, n in rows.fetchall()]  # type: ignore[call-overload]


def queued(url: str) -> int:
    with server(url) as conn:
        row = conn.execute("SELECT count(*) FROM history_unsealed").fetchone()
        return int(row[0]) if row else -1  # type: ignore[call-overload]


def assert_frames_are_the_rows(store: SessionStore, **filters: object) -> None:
    for read in (history.sessions, history.tool_calls):
        got = read(store, **filters)  # type: ignore[operator]
        want = read(store, cache=False, **filters)  # type: ignore[operator]
        pd.testing.assert_frame_equal(got, want)


def behind_the_triggers(url: str, sql: str) -> None:
    """Change rows with the store's triggers off, as nothing in spawnkit ever does: a read
    that still shows what was sealed read the segments, not the rows."""
    with server(url) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(sql)


def test_completed_runs_are_sealed_and_read_from_their_segments(
    store: SessionStore, postgres_url: str, isolated_home: Path
) -> None:
    # Ids out of creation order: the frames' order (created_at; session id) is rebuilt.
    ids = [f"s{(n * 7) % 10:02d}" for n in range(2 * SEAL + 1)]
    runs(store, ids)
    assert sealed(postgres_url) == [(0, SEAL), (0, SEAL)]
    assert queued(postgres_url) == 1
    assert_frames_are_the_rows(store)
    assert_frames_are_the_rows(store, butler="health")
    want = history.tool_calls(store, cache=False)
    behind_the_triggers(postgres_url, "UPDATE tool_calls SET tool = 'changed'")
    got = history.tool_calls(store)
    # Sealed calls come from the segments; the one queued run's are read as rows.
    fresh = got["session_id"] == ids[-1]
    assert (got.loc[fresh, "tool"] == "changed").all()
    pd.testing.assert_frame_equal(got[~fresh].astype(str), want[~fresh].astype(str))


@pytest.mark.parametrize("tail", ["rows", "columns"])
def test_open_runs_stay_out_of_segments_and_are_sealed_once_done(
    store: SessionStore, postgres_url: str, isolated_home: Path, tail: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """``columns``: the rows not sealed yet are read as if they were many, through ADBC in
    the snapshot the blobs were read in (exported to its connection)."""
    large: list[str] = []
    if tail == "columns":
        monkeypatch.setattr(store_query, "SMALL_ROWS", 0)
        through_adbc = server_query.Snapshot.large

        def counted(self: server_query.Snapshot, sql: str, params: Any = ()) -> Any:
            large.append(sql)
            return through_adbc(self, sql, params)

        monkeypatch.setattr(server_query.Snapshot, "large", counted)
    store.create_session("open", butler="health", runtime="claude-code", model=None,
                         prompt="p", context=None, trigger_source="external",
                         created_at=T0)  # fmt: skip
    runs(store, [f"r{n}" for n in range(SEAL)], start=1)
    assert sealed(postgres_url) == [(0, SEAL)]
    assert_frames_are_the_rows(store)
    store.complete_session("open", SpawnerResult(output="x", session_id="open", success=True))
    assert queued(postgres_url) == 1
    assert_frames_are_the_rows(store)
    assert store.seal_history(force=True)
    assert queued(postgres_url) == 0
    assert_frames_are_the_rows(store)
    assert bool(large) == (tail == "columns")


def test_a_changed_sealed_record_makes_the_segments_stale_then_they_start_over(
    store: SessionStore, postgres_url: str, isolated_home: Path
) -> None:
    runs(store, [f"s{n}" for n in range(SEAL)])
    assert sealed(postgres_url) == [(0, SEAL)]
    with server(postgres_url) as conn:
        conn.execute("UPDATE sessions SET cost_usd = 9.5 WHERE id = 's1'")
        conn.execute("UPDATE tool_calls SET tool = 'other' WHERE session_id = 's2'")
    assert_frames_are_the_rows(store)  # stale segments are not read
    assert history.sessions(store).set_index("session_id").loc["s1", "cost_usd"] == 9.5
    runs(store, [f"t{n}" for n in range(SEAL)], start=SEAL)  # the next seal starts over
    assert sealed(postgres_url) == []
    assert queued(postgres_url) == 2 * SEAL
    assert_frames_are_the_rows(store)
    assert store.seal_history(force=True, limit=100)
    assert sealed(postgres_url) == [(0, 2 * SEAL)]
    assert_frames_are_the_rows(store)


def test_segments_merge_level_by_level(
    store: SessionStore, postgres_url: str, isolated_home: Path
) -> None:
    n = SEAL * server_segments.FANOUT
    runs(store, [f"m{i:03d}" for i in range(n + SEAL)], calls=1)
    assert sealed(postgres_url) == [(1, n), (0, SEAL)]
    assert_frames_are_the_rows(store)


def test_hosts_completing_runs_at_once_seal_every_session_exactly_once(
    postgres_url: str, small_seals: None, isolated_home: Path
) -> None:
    stores = [SessionStore(postgres_url) for _ in range(4)]
    try:

        def complete(k: int) -> None:
            runs(stores[k], [f"h{k}-{i:02d}" for i in range(12)], start=k * 100, calls=2)

        threads = [threading.Thread(target=complete, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert sum(n for _, n in sealed(postgres_url)) + queued(postgres_url) == 48
        with server(postgres_url) as conn:
            epoch = conn.execute("SELECT sealed_epoch FROM history_epoch").fetchone()
        assert epoch == (0,)  # nothing sealed changed
        frames = history.sessions(stores[0]), history.tool_calls(stores[0])
        assert len(frames[0]) == 48 and len(frames[1]) == 96
        assert frames[0]["session_id"].is_unique
        assert_frames_are_the_rows(stores[0])
    finally:
        for opened in stores:
            opened.close()


def test_a_queued_session_deleted_leaves_the_queue_and_the_segments_current(
    store: SessionStore, postgres_url: str, isolated_home: Path
) -> None:
    runs(store, ["a", "b"])
    with server(postgres_url) as conn:
        conn.execute("DELETE FROM sessions WHERE id = 'a'")
        conn.execute("DELETE FROM tool_calls WHERE session_id = 'a'")
        epoch = conn.execute("SELECT sealed_epoch FROM history_epoch").fetchone()
    assert epoch == (0,) and queued(postgres_url) == 1
    runs(store, ["c", "d"], start=2)
    assert sealed(postgres_url) == [(0, SEAL)]
    assert_frames_are_the_rows(store)


def queue(url: str) -> list[tuple[str, str]]:
    with server(url) as conn:
        rows = conn.execute("SELECT session_id, created_at FROM history_unsealed ORDER BY 2")
        return [(str(sid), str(at)) for sid, at in rows.fetchall()]  # type: ignore[misc]


def test_a_long_queue_is_taken_oldest_first_through_its_index(
    store: SessionStore, postgres_url: str, isolated_home: Path
) -> None:
    """However long the queue (a store queued again whole), a seal reads only its first
    entries: the oldest, from the queue's index in the sessions' order, with no sort."""
    ids = [f"s{n:02}" for n in range(4 * SEAL)]  # created (and completed) in this order
    runs(store, ids)
    with server(postgres_url) as conn:
        conn.execute("UPDATE sessions SET cost_usd = 1 WHERE id = 's00'")  # stale
    store.seal_history(force=True, limit=SEAL)  # starts over: every session queued again
    assert sealed(postgres_url) == [] and len(queue(postgres_url)) == len(ids)
    assert store.seal_history(force=True, limit=SEAL)
    assert sealed(postgres_url) == [(0, SEAL)]
    assert [sid for sid, _ in queue(postgres_url)] == ids[SEAL:]  # the oldest were taken
    take = server_segments.TAKE_QUEUED.replace("?", str(SEAL))
    with server(postgres_url) as conn:
        conn.execute("SET enable_seqscan = off")  # as the planner does for a long queue
        plan = json.dumps(conn.execute(f"EXPLAIN (FORMAT JSON) {take}").fetchone())
    assert "history_unsealed_in_order" in plan and '"Sort"' not in plan


def test_a_schema_12_queue_gains_the_creation_times_and_keeps_its_sessions(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, isolated_home: Path
) -> None:
    for module in (session_store_module, server_segments):  # no seal before the test's own
        monkeypatch.setattr(module, "SEAL_SESSIONS", 5)
    with SessionStore(postgres_url) as store:
        runs(store, ["b", "a"], start=0)
    with server(postgres_url) as conn:  # back to step 12's queue
        conn.execute("DROP INDEX history_unsealed_in_order")
        conn.execute("ALTER TABLE history_unsealed DROP COLUMN created_at")
        conn.execute(
            "CREATE OR REPLACE FUNCTION history_queue_session() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN INSERT INTO spawnkit.history_unsealed "
            "VALUES (NEW.id) ON CONFLICT DO NOTHING; RETURN NULL; END $$"
        )
        conn.execute("DELETE FROM schema_version WHERE version = 13")
    with SessionStore(postgres_url) as store:
        runs(store, ["c"], start=2)  # queued by step 13's trigger
        at = {r.id: r.created_at.isoformat() for r in store.list_sessions(limit=10)}
        got = queue(postgres_url)
        assert [sid for sid, _ in got] == ["b", "a", "c"]
        assert all(stamp.startswith(at[sid][:19]) for sid, stamp in got)
        assert store.seal_history(force=True, limit=2)
        assert [sid for sid, _ in queue(postgres_url)] == ["c"]
        assert_frames_are_the_rows(store)


# What a read of a server store must not load: the store's writer and its connection pool,
# and ADBC's driver (with pyarrow.dataset), when every row comes through psycopg.
WRITER_AND_ADBC = ("spawnkit.store.postgres", "psycopg_pool", "adbc_driver_postgresql",
                   "pyarrow.dataset")  # fmt: skip


def test_a_first_read_of_segments_loads_neither_the_writer_nor_adbc(
    store: SessionStore, postgres_url: str, isolated_home: Path
) -> None:
    """What a first read holds resident is the frame's: in a fresh process, reading both
    frames of a sealed store imports none of :data:`WRITER_AND_ADBC` (the writer's module
    and its pool were 1.4 MB resident in a read that needs neither)."""
    runs(store, [f"r{n}" for n in range(SEAL + 1)])
    assert sealed(postgres_url) == [(0, SEAL)]
    probe = (
        "import json, sys\n"
        "from spawnkit import history\n"
        "frames = [history.sessions(sys.argv[1]), history.tool_calls(sys.argv[1])]\n"
        "print(json.dumps({'rows': [len(f) for f in frames],\n"
        f"    'loaded': [m for m in {WRITER_AND_ADBC!r} if m in sys.modules]}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, postgres_url], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["rows"] == [SEAL + 1, 2 * (SEAL + 1)]
    assert seen["loaded"] == []
