"""The local columnar cache of a PostgreSQL store's sessions (spawnkit.history.server_cache).

Every test runs on a real server (tests/postgres.py). A read through the cache must give
the frame a direct read (``cache=False``) gives, whatever was written, updated or deleted
since the cache was made, and whoever was writing while it was read.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pandas as pd
import psycopg
import pyarrow as pa
import pytest

from spawnkit import history
from spawnkit.history import server_cache, server_query
from spawnkit.result import SpawnerResult
from spawnkit.store import SessionStore

from .postgres import PostgresServer
from .test_history_store import T0, fill, record


@pytest.fixture
def server_store(postgres_url: str) -> Iterator[SessionStore]:
    with SessionStore(postgres_url) as opened:
        yield fill(opened)


def _folder(home: Path) -> Path:
    found = list((home / "history-cache").glob("server-*"))
    assert len(found) == 1, found
    return found[0]


def _same_as_the_database(store: SessionStore | str, **filters: object) -> pd.DataFrame:
    cached = history.sessions(store, cache=True, **filters)  # type: ignore[arg-type]
    pd.testing.assert_frame_equal(cached, history.sessions(store, cache=False, **filters))  # type: ignore[arg-type]
    return cached


@pytest.mark.parametrize(
    "filters",
    [{}, {"butler": "health"}, {"status": ["success"], "since": T0 + timedelta(days=1)},
     {"runtime": "codex", "until": "2026-10-03"}, {"success": False}, {"kind": ["ask", "chat"]},
     {"columns": ["session_id", "butler", "created_at", "cost_usd"]}],
)  # fmt: skip
def test_the_server_cache_gives_the_frames_of_the_database(
    server_store: SessionStore, isolated_home: Path, filters: dict[str, object]
) -> None:
    server_store.create_session("queued", butler="health", runtime="claude-code", model=None,
                                prompt="waits", context=None, trigger_source="external",
                                created_at=T0 + timedelta(days=5))  # fmt: skip
    first = _same_as_the_database(server_store, **filters)  # builds the cache
    assert (_folder(isolated_home) / "sessions.arrow").is_file()
    again = _same_as_the_database(server_store, **filters)  # served from it
    pd.testing.assert_frame_equal(first, again)


@pytest.mark.parametrize("rewrite", [1, 10_000], ids=["rewritten", "merged-in-memory"])
def test_updates_new_and_deleted_sessions_show_up_and_only_they_are_read(
    server_store: SessionStore, monkeypatch: pytest.MonkeyPatch, rewrite: int
) -> None:
    monkeypatch.setattr(server_cache, "REWRITE_ROWS", rewrite)
    server_store.create_session("late", butler="general", runtime="codex", model="gpt-5",
                                prompt="still running", context=None, trigger_source="external",
                                created_at=T0 + timedelta(hours=1))  # fmt: skip
    before = _same_as_the_database(server_store)
    assert before.set_index("session_id").loc["late", "status"] == "queued"
    read: list[int] = []

    def counted(real: Callable[..., pa.Table]) -> Callable[..., pa.Table]:
        def counting(self: server_query.Snapshot, sql: str, params: object = ()) -> pa.Table:
            table = real(self, sql, params)
            if "FROM sessions" in sql and not sql.startswith("SELECT count(*)"):
                read.append(table.num_rows)
            return table

        return counting

    for way in ("__call__", "large"):  # rows, or ADBC's columns
        monkeypatch.setattr(
            server_query.Snapshot, way, counted(getattr(server_query.Snapshot, way))
        )
    # An old open session completes (it sorts among old rows), one is updated, a new one
    # arrives, one is deleted.
    server_store.complete_session("late", SpawnerResult(output="x", success=True,
                                  session_id="late", status="success"))  # fmt: skip
    with psycopg.connect(str(server_store.source), autocommit=True) as conn:
        conn.execute("UPDATE spawnkit.sessions SET butler = 'renamed' WHERE id = 'c'")
        conn.execute("DELETE FROM spawnkit.sessions WHERE id = 'b'")
    record(server_store, "e", butler="health", at=T0 + timedelta(days=6))
    read.clear()
    frame = history.sessions(server_store, cache=True)
    assert read == [3]  # late, c and e: not the whole table
    assert list(frame["session_id"]) == ["a", "late", "c", "d", "e"]
    by_id = frame.set_index("session_id")
    assert by_id.loc["late", "status"] == "success" and by_id.loc["c", "butler"] == "renamed"
    pd.testing.assert_frame_equal(frame, history.sessions(server_store, cache=False))
    # The same again (from the rewritten cache, or merged again from the same rows).
    pd.testing.assert_frame_equal(history.sessions(server_store, cache=True), frame)
    # A session deleted and made again under its id is the new one.
    with psycopg.connect(str(server_store.source), autocommit=True) as conn:
        conn.execute("DELETE FROM spawnkit.sessions WHERE id = 'a'")
        conn.execute("DELETE FROM spawnkit.tool_calls WHERE session_id = 'a'")
    record(server_store, "a", butler="finance", at=T0 + timedelta(days=7))
    frame = _same_as_the_database(server_store)
    assert list(frame["session_id"]) == ["late", "c", "d", "e", "a"]
    assert frame["butler"].iloc[-1] == "finance"


def test_a_store_before_schema_7_is_read_directly(
    server_store: SessionStore, isolated_home: Path
) -> None:
    url = str(server_store.source)
    server_store.close()
    with psycopg.connect(url, autocommit=True) as conn:  # as schema 6 left it, markers gone
        for name in ("session_changed", "note_deleted_sessions", "bump_history_epoch"):
            conn.execute(f"DROP FUNCTION spawnkit.{name}() CASCADE")
        conn.execute("DROP TABLE spawnkit.history_epoch, spawnkit.deleted_sessions")
        conn.execute("ALTER TABLE spawnkit.sessions DROP COLUMN change_xid")
        conn.execute("ALTER TABLE spawnkit.sessions DROP COLUMN owner_seal")  # 9's
        conn.execute("ALTER TABLE spawnkit.sessions DROP COLUMN network_denied")  # 10's
        conn.execute("ALTER TABLE spawnkit.sessions DROP COLUMN permissions")  # 11's
        for name in ("history_queue_session", "history_session_changed",  # 12's
                     "history_call_changed", "history_sealed_truncated"):  # fmt: skip
            conn.execute(f"DROP FUNCTION spawnkit.{name}() CASCADE")
        conn.execute("DROP FUNCTION spawnkit.history_sealed_changed(TEXT)")
        conn.execute("DROP TABLE spawnkit.history_segments, spawnkit.history_unsealed")
        conn.execute("DELETE FROM spawnkit.schema_version WHERE version >= 7")
    frame = _same_as_the_database(url)
    assert list(frame["session_id"]) == ["a", "b", "c", "d"]
    assert not (isolated_home / "history-cache").exists()
    with SessionStore(url) as migrated:  # opening it migrates; then the cache is used
        record(migrated, "e", butler="health", at=T0 + timedelta(days=4))
    assert list(_same_as_the_database(url)["session_id"]) == ["a", "b", "c", "d", "e"]
    assert (_folder(isolated_home) / "sessions.arrow").is_file()


def test_a_truncate_makes_the_cache_stale(server_store: SessionStore) -> None:
    assert len(_same_as_the_database(server_store)) == 4
    with psycopg.connect(str(server_store.source), autocommit=True) as conn:
        conn.execute("TRUNCATE spawnkit.sessions, spawnkit.tool_calls")
    assert history.sessions(server_store).empty
    record(server_store, "z", butler="health")
    assert list(_same_as_the_database(server_store)["session_id"]) == ["z"]


def test_a_lease_renewal_or_an_update_that_changes_nothing_keeps_the_change_marker(
    server_store: SessionStore,
) -> None:
    """Open runs renew their lease every few seconds: that alone must not make every reader
    fetch them again; any other change must."""
    server_store.create_session(
        "open", butler="health", runtime="codex", model=None, prompt="p", context=None,
        trigger_source="external",
    )  # fmt: skip

    def marker() -> int:
        with psycopg.connect(str(server_store.source), autocommit=True) as conn:
            row = conn.execute("SELECT change_xid FROM spawnkit.sessions WHERE id = 'open'")
            return int(row.fetchone()[0])  # type: ignore[index]

    first = marker()
    assert server_store.renew_leases(["open"]) == 1
    with psycopg.connect(str(server_store.source), autocommit=True) as conn:
        conn.execute("UPDATE spawnkit.sessions SET status = status WHERE id = 'open'")
    assert marker() == first
    server_store.mark_started("open", started_at=T0, trace_id="t" * 32)
    assert marker() > first


def test_a_cache_from_another_database_is_not_used(
    server_store: SessionStore, postgres: PostgresServer, isolated_home: Path
) -> None:
    url = str(server_store.source)
    history.sessions(url)
    made = _folder(isolated_home)
    other = postgres.create_database()
    try:
        other_url = postgres.url(other)
        with SessionStore(other_url) as second:
            record(second, "only-here", butler="travel")
        # The other database's cache folder holds the first one's file, as if the URL had
        # come to name another database (or the database was made again under its name).
        target = server_cache.ServerCache(other_url).directory
        shutil.copytree(made, target)
        frame = history.sessions(other_url)
        assert list(frame["session_id"]) == ["only-here"]
        assert list(history.sessions(url)["session_id"]) == ["a", "b", "c", "d"]
        # The same name made again is another database too (new oid and token).
        postgres.drop_database(other)
        postgres.create_database(other)
        with SessionStore(other_url) as again:
            record(again, "reborn", butler="travel")
        assert list(history.sessions(other_url)["session_id"]) == ["reborn"]
    finally:
        postgres.drop_database(other)


def test_a_transaction_that_commits_after_a_read_is_not_missed(
    server_store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that began before a read and commits after it (its change marker is older
    than rows the read saw) still shows up in the next read."""
    monkeypatch.setattr(server_cache, "REWRITE_ROWS", 1)  # every read rewrites the cache
    url = str(server_store.source)
    history.sessions(url)
    with psycopg.connect(url) as slow:
        slow.execute(
            "INSERT INTO spawnkit.sessions (id, butler, runtime, prompt, trigger_source, "
            "status, created_at) VALUES ('slow', 'health', 'codex', 'p', 'external', "
            "'queued', %s)",
            ((T0 + timedelta(days=8)).isoformat(),),
        )  # its transaction id is taken now...
        record(server_store, "fast", butler="health", at=T0 + timedelta(days=9))
        seen = history.sessions(url)  # ...a read sees "fast" and rewrites the cache...
        assert "slow" not in set(seen["session_id"]) and "fast" in set(seen["session_id"])
        slow.commit()  # ...and "slow" commits after it
    frame = _same_as_the_database(url)
    assert list(frame["session_id"])[-2:] == ["slow", "fast"]


WRITER = """
import sys
from datetime import UTC, datetime, timedelta
from spawnkit.result import SpawnerResult
from spawnkit.store import SessionStore

url, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = datetime(2026, 10, 1, tzinfo=UTC)
with SessionStore(url) as store:
    for i in range(n):
        sid = f"{prefix}-{i:04d}"
        store.create_session(sid, butler="health", runtime="codex", model=None, prompt="p",
                             context=None, trigger_source="external",
                             created_at=t0 + timedelta(minutes=i))
        store.mark_started(sid, started_at=t0 + timedelta(minutes=i, seconds=1))
        if i % 3:
            store.complete_session(sid, SpawnerResult(output="x", success=True,
                                   session_id=sid, status="success"))
        print(i, flush=True)
"""


def test_reads_while_two_processes_write(
    server_store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writer processes create, start and complete sessions while this process reads
    through the cache again and again (rewriting it each time): every read holds what was
    there before it began, and the last equals a direct read."""
    monkeypatch.setattr(server_cache, "REWRITE_ROWS", 1)
    url = str(server_store.source)
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WRITER), url, name, "150"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("w1", "w2")
    ]
    try:
        assert all(w.stdout is not None and w.stdout.readline() for w in writers)  # running
        reads = 0
        while any(w.poll() is None for w in writers) or reads < 3:
            with SessionStore(url) as plain:
                before = {s.id: s.status for s in plain.list_sessions(limit=1000)}
            frame = history.sessions(url).set_index("session_id")
            assert set(before) <= set(frame.index)
            done = [sid for sid, status in before.items() if status == "success"]
            assert (frame.loc[done, "status"] == "success").all()
            reads += 1
        assert [w.wait(timeout=120) for w in writers] == [0, 0]
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait()
    frame = _same_as_the_database(url)
    assert len(frame) == 4 + 300 and reads >= 3


@pytest.mark.parametrize("seed", range(6))
def test_merging_changed_rows_gives_the_order_of_a_full_sort(seed: int) -> None:
    """New, changed and deleted sessions merged into cached columns (by slices or one
    gather, with ties on created_at) come out as a sort of the whole would give them."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    n = [0, 5, 50, 300, 2000, 5000][seed]
    ids = [f"s{i:05d}" for i in range(n)]
    created = rng.integers(0, max(1, n // 3), n) * 1000  # ties within the base
    base = pa.table(
        {
            "session_id": pa.array(ids, pa.string()),
            "created_at": pa.array(created, pa.timestamp("ns")),
        }
    )
    base = base.sort_by([("created_at", "ascending"), ("session_id", "ascending")])
    changed = [ids[i] for i in rng.choice(n, min(n, [0, 2, 10, 100, 3, 900][seed]), False)]
    new = [f"n{i:05d}" for i in range([3, 0, 7, 1, 80, 0][seed])]
    stamps = rng.integers(0, max(1, n // 3) + 5, len(changed) + len(new)) * 1000 + (seed % 2)
    tail = pa.table({"session_id": pa.array(changed + new, pa.string()),
                     "created_at": pa.array(stamps, pa.timestamp("ns"))})  # fmt: skip
    tail = tail.sort_by([("created_at", "ascending"), ("session_id", "ascending")])
    deleted = [ids[i] for i in rng.choice(n, min(n, 4), False)] if n else []
    stale = pa.array(changed + deleted, pa.string())
    got = server_cache.merge(base, tail, stale)
    kept = base.filter(pa.compute.invert(pa.compute.is_in(base["session_id"], value_set=stale)))
    want = pa.concat_tables([kept, tail]).sort_by(
        [("created_at", "ascending"), ("session_id", "ascending")]
    )
    assert got.to_pydict() == want.to_pydict()
    assert got.num_rows == n - len(set(changed) | set(deleted)) + len(changed) + len(new)
