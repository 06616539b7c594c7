"""spawnkit.history.sessions / tool_calls / usage on a store written through SessionStore.

The frames are tested on both backends (``store`` is a SQLite file, then a fresh PostgreSQL
database read through ADBC); what only a SQLite file has (its columnar cache, read-only
reads of an unmigrated file) uses ``filled_file``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spawnkit import history
from spawnkit.result import SpawnerResult, ToolCall, Usage
from spawnkit.store import SessionStore

T0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)


def record(
    store: SessionStore,
    sid: str,
    *,
    butler: str,
    runtime: str = "claude-code",
    model: str | None = "claude-sonnet-4-5",
    at: datetime = T0,
    success: bool = True,
    cost: float | None = None,
    calls: int = 2,
    role: str | None = None,
    kind: str = "run",
    sources: tuple[str, ...] = (),
) -> None:
    store.create_session(sid, butler=butler, runtime=runtime, model=model, prompt="p",
                         context=None, trigger_source="external", created_at=at,
                         role=role, kind=kind, sources=sources)  # fmt: skip
    store.mark_started(sid, started_at=at + timedelta(seconds=1), trace_id=f"trace-{sid}")
    tool_calls = [
        ToolCall.start(
            f"{sid}-{i}",
            "mcp__health__state_get" if i % 2 else "Bash",
            {"i": i},
            at + timedelta(seconds=2 + i),
        ).finish("out", i == 1 and not success, at + timedelta(seconds=2 + i, milliseconds=40))
        for i in range(calls)
    ]
    result = SpawnerResult(
        output="done", tool_calls=tool_calls, success=success, session_id=sid,
        duration_ms=5000, usage=Usage(1_000_000, 100_000, 2_000_000, 300_000), cost_usd=cost,
        model=model, status="success" if success else "failed",
        error_kind=None if success else "crash", num_turns=3,
    )  # fmt: skip
    store.complete_session(sid, result, completed_at=at + timedelta(seconds=6))


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    """A store on each backend: a SQLite file, a fresh PostgreSQL database."""
    target = (
        str(request.getfixturevalue("postgres_url"))
        if request.param == "postgresql"
        else tmp_path / "sessions.db"
    )
    with SessionStore(target) as opened:
        yield opened


@pytest.fixture
def filled_file(tmp_path: Path) -> Iterator[SessionStore]:
    """The ``filled`` history in a SQLite file."""
    with SessionStore(tmp_path / "file.db") as opened:
        yield fill(opened)


@pytest.fixture
def filled(store: SessionStore) -> SessionStore:
    return fill(store)


def fill(store: SessionStore) -> SessionStore:
    record(store, "a", butler="health", cost=0.5, role="researcher")
    record(store, "b", butler="health", at=T0 + timedelta(days=1), success=False, calls=3)
    record(store, "c", butler="general", runtime="codex", model="gpt-5",
           at=T0 + timedelta(days=1, hours=15, minutes=30), kind="ask",
           sources=("notes", "plan"))  # fmt: skip
    record(store, "d", butler="general", model="no-such-model", at=T0 + timedelta(days=3),
           calls=0, kind="chat", sources=("notes",))  # fmt: skip
    return store


def test_sessions_frame_has_real_dtypes_and_shared_names(filled: SessionStore) -> None:
    frame = history.sessions(filled)
    assert list(frame["session_id"]) == ["a", "b", "c", "d"]
    for column in ("session_id", "source", "started_at", "ended_at", "input_tokens",
                   "output_tokens", "cache_write_tokens", "cache_read_tokens", "cost_usd",
                   "cost_source", "n_tool_calls", "trace_id"):  # fmt: skip
        assert column in frame.columns
    assert str(frame["created_at"].dtype) == "datetime64[ns, UTC]"
    assert frame["ended_at"].iloc[0] == pd.Timestamp(T0 + timedelta(seconds=6))
    for column in ("butler", "runtime", "model", "status", "source"):
        assert frame[column].dtype == "category"
    assert frame["input_tokens"].dtype == "Int64" and frame["cost_usd"].dtype == "float64"
    assert frame["success"].dtype == "boolean" and list(frame["success"]) == [
        True,
        False,
        True,
        True,
    ]
    assert list(frame["n_tool_calls"]) == [2, 3, 2, 0]
    assert frame["trace_id"].iloc[0] == "trace-a"
    assert frame["role"].dtype == "category" and frame["role"].iloc[0] == "researcher"
    assert frame["role"].isna().sum() == 3


def test_asks_and_chats_carry_their_kind_and_sources(filled: SessionStore) -> None:
    frame = history.sessions(filled)
    assert frame["kind"].dtype == "category"
    assert list(frame["kind"]) == ["run", "run", "ask", "chat"]
    assert list(frame["sources"].fillna("-")) == ["-", "-", "notes,plan", "notes"]

    def ids(**filters: object) -> list[str]:
        return list(history.sessions(filled, **filters)["session_id"])  # type: ignore[arg-type]

    assert ids(kind="ask") == ["c"] and ids(kind=["ask", "chat"]) == ["c", "d"]
    assert (
        ids(kind="run", butler="health") == ["a", "b"] and ids(kind="chat", runtime="codex") == []
    )
    calls = history.tool_calls(filled, kind="ask")
    assert set(calls["session_id"]) == {"c"} and len(calls) == 2
    assert list(history.usage(filled, kind="run", by=("kind",))["sessions"]) == [1, 1]


def test_a_store_older_than_roles_reads_with_an_empty_role(filled_file: SessionStore) -> None:
    filled_file.close()
    conn = sqlite3.connect(filled_file.path)
    for column in ("role", "kind", "sources"):
        conn.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    frame = history.sessions(filled_file.path)
    assert len(frame) == 4 and frame["role"].isna().all()
    # Before kinds existed every session was a butler's run.
    assert set(frame["kind"]) == {"run"} and frame["sources"].isna().all()
    assert len(history.sessions(filled_file.path, kind="run")) == 4
    assert history.tool_calls(filled_file.path, kind="ask").empty


def test_costs_reported_computed_or_unpriced(filled: SessionStore) -> None:
    frame = history.sessions(filled).set_index("session_id")
    assert frame.loc["a", "cost_source"] == "reported" and frame.loc["a", "cost_usd"] == 0.5
    # claude-sonnet-4-5, 1M input, 100k output, 300k cache writes, 2M cache reads; tiers
    # apply past 200k tokens of each kind.
    expected = (200_000 * 3 + 800_000 * 6 + 100_000 * 15 + 200_000 * 3.75 + 100_000 * 7.5
                + 200_000 * 0.3 + 1_800_000 * 0.6) / 1e6  # fmt: skip
    assert frame.loc["b", "cost_source"] == "computed"
    assert frame.loc["b", "cost_usd"] == pytest.approx(expected)
    assert frame.loc["c", "cost_usd"] == pytest.approx(
        (1_000_000 * 1.25 + 100_000 * 10 + 300_000 * 1.25 + 2_000_000 * 0.125) / 1e6
    )
    assert frame.loc["d", "cost_source"] == "unpriced" and pd.isna(frame.loc["d", "cost_usd"])
    cheap = history.default_pricing().with_prices({"no-such-model": {"input": 1, "output": 1}})
    priced = history.sessions(filled, pricing=cheap).set_index("session_id")
    assert priced.loc["d", "cost_usd"] == pytest.approx((1_000_000 + 100_000 + 300_000 + 2e6) / 1e6)


def test_filters_combine(filled: SessionStore) -> None:
    def ids(**filters: object) -> list[str]:
        return list(history.sessions(filled, **filters)["session_id"])  # type: ignore[arg-type]

    assert ids(butler="health") == ["a", "b"]
    assert ids(butler=["health", "general"], runtime="codex") == ["c"]
    assert ids(since=T0 + timedelta(days=1), until="2026-10-03T01:00") == ["b", "c"]
    assert ids(since=T0 + timedelta(days=1), until="2026-10-03") == ["b"]
    assert ids(since="2026-10-02T10:00:00+02:00") == ["b", "c", "d"]
    assert ids(success=False) == ["b"] and ids(butler=[]) == []


def test_tool_calls_join_on_session_id(filled: SessionStore) -> None:
    calls = history.tool_calls(filled)
    assert len(calls) == 7 and list(calls["seq"].iloc[:2]) == [0, 1]
    assert all(calls[c].dtype == "category" for c in ("name", "server", "tool", "status"))
    assert set(calls["server"].dropna()) == {"health"} and set(calls["tool"]) == {
        "Bash",
        "state_get",
    }
    assert calls["duration_ms"].dtype == "Int64" and set(calls["duration_ms"]) == {40}
    assert str(calls["started_at"].dtype) == "datetime64[ns, UTC]"
    assert (
        "output" not in calls and history.tool_calls(filled, output=True)["output"].iloc[0] == "out"
    )
    sessions = history.sessions(filled)[["session_id", "butler"]]
    joined = calls.merge(sessions, on="session_id", validate="many_to_one")
    failures = joined[joined["status"] == "error"]
    assert list(failures["session_id"]) == ["b"] and list(failures["butler"]) == ["health"]
    assert list(history.tool_calls(filled, butler="general")["session_id"].unique()) == ["c"]


def test_usage_per_day_and_butler(filled: SessionStore) -> None:
    usage = history.usage(filled, by=("butler",))
    assert list(usage["date"]) == ["2026-10-01", "2026-10-02", "2026-10-03", "2026-10-04"]
    assert list(usage["butler"]) == ["health", "health", "general", "general"]
    assert list(usage["failed"]) == [0, 1, 0, 0] and int(usage["input_tokens"].sum()) == 4_000_000
    # c was created at 00:30 UTC on the 3rd: the evening of the 2nd in New York.
    new_york = history.usage(filled, by=(), tz="America/New_York")
    assert list(new_york["date"]) == ["2026-10-01", "2026-10-02", "2026-10-04"]
    assert list(new_york["sessions"]) == [1, 2, 1]


def test_a_named_store_must_exist_the_default_may_not(tmp_path: Path, isolated_home: Path) -> None:
    with pytest.raises(history.HistoryError, match="no session store"):
        history.sessions(tmp_path / "none.db")
    # No run recorded yet on this machine: empty frames with the real dtypes, no file created.
    fresh = history.sessions()
    assert fresh.empty and fresh["created_at"].dtype == "datetime64[ns, UTC]"
    assert fresh["input_tokens"].dtype == "Int64" and history.tool_calls().empty
    assert not (isolated_home / "sessions.db").exists()


def test_empty_store_gives_empty_frames(store: SessionStore) -> None:
    assert history.sessions(store).empty and history.tool_calls(store).empty
    assert history.usage(store).empty


def test_status_filter_and_columns_run_in_the_database(filled: SessionStore) -> None:
    frame = history.sessions(filled, status=["failed"], columns=["session_id", "prompt", "role"])
    assert list(frame.columns) == ["session_id", "prompt", "role"]
    assert list(frame["session_id"]) == ["b"] and list(frame["prompt"]) == ["p"]
    priced = history.sessions(filled, columns=["session_id", "cost_usd", "cost_source"])
    assert list(priced.columns) == ["session_id", "cost_usd", "cost_source"]
    assert priced["cost_source"].iloc[0] == "reported"
    calls = history.tool_calls(filled, status="failed", columns=["session_id", "seq", "status"])
    assert list(calls.columns) == ["session_id", "seq", "status"] and len(calls) == 3
    with pytest.raises(history.HistoryError, match="unknown columns"):
        history.sessions(filled, columns=["nope"])


def _frames(store: SessionStore, **filters: object) -> tuple[pd.DataFrame, pd.DataFrame]:
    return (history.sessions(store, **filters), history.tool_calls(store, **filters))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "filters",
    [{}, {"butler": "health"}, {"status": ["success"], "since": T0 + timedelta(days=1)},
     {"runtime": "codex", "until": "2026-10-03"}, {"success": False}, {"kind": ["ask", "chat"]}],
)  # fmt: skip
def test_the_columnar_cache_gives_the_frames_of_the_database(
    filled_file: SessionStore, filters: dict[str, object]
) -> None:
    record(filled_file, "open", butler="health", at=T0 + timedelta(days=2))  # completed...
    filled_file.create_session(
        "queued",
        butler="health",
        runtime="claude-code",
        model=None,
        prompt="waits",
        context=None,
        trigger_source="external",
        created_at=T0 + timedelta(days=5),
    )  # ... and one still open
    direct = _frames(filled_file, cache=False, **filters)
    first = _frames(filled_file, cache=True, **filters)  # builds the cache (no filter) or not
    again = _frames(filled_file, cache=True, **filters)
    for got in (first, again):
        pd.testing.assert_frame_equal(got[0], direct[0])
        pd.testing.assert_frame_equal(got[1], direct[1])


def as_before_segments(store: SessionStore) -> None:
    """The store as a spawnkit before schema 16 left it: no columnar copy of its own, so
    a reader keeps one in its home (``history-cache``)."""
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute("DROP TABLE history_segments")
    conn.close()


def test_the_cache_serves_what_it_holds_and_reads_only_what_is_new(
    filled_file: SessionStore, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spawnkit.history import store_frames

    as_before_segments(filled_file)

    monkeypatch.setattr(store_frames, "REWRITE_ROWS", 1)
    filled_file.create_session("late", butler="general", runtime="codex", model="gpt-5",
                          prompt="still running", context=None, trigger_source="external",
                          created_at=T0 + timedelta(days=4))  # fmt: skip
    history.sessions(filled_file, cache=True)
    folder = next((isolated_home / "history-cache").glob("store-*"))
    assert (folder / "sessions.arrow").is_file()
    queries: list[str] = []
    real_query = store_frames.query

    def counted(path: Path, sql: str, params: object = (), **how: bool) -> object:
        queries.append(sql)
        return real_query(path, sql, params, **how)  # type: ignore[arg-type]

    monkeypatch.setattr(store_frames, "query", counted)
    # The open session completes, a new one arrives: both come from the database, once.
    filled_file.complete_session("late", SpawnerResult(output="x", success=True, session_id="late",
                                                  status="success"))  # fmt: skip
    record(filled_file, "e", butler="health", at=T0 + timedelta(days=6))
    frame = history.sessions(filled_file, cache=True)
    assert list(frame["session_id"]) == ["a", "b", "c", "d", "late", "e"]
    assert frame.set_index("session_id").loc["late", "status"] == "success"
    assert len(queries) == 1 and "rowid > ?" in queries[0]
    assert "WHERE rowid > ? OR rowid IN (?)" in queries[0]


@pytest.mark.parametrize("small_rows", [20_000, 0])
def test_a_warm_read_takes_its_few_new_rows_without_the_child(
    filled_file: SessionStore, monkeypatch: pytest.MonkeyPatch, small_rows: int
) -> None:
    """A large store is read by a child process (about 0.3 s to start); once the cache holds
    its history, the few rows written since are read in this process."""
    from spawnkit.history import store_frames, store_query

    monkeypatch.setattr(store_query, "CHILD_MIN_BYTES", 0)  # every store counts as large
    monkeypatch.setattr(store_frames, "SMALL_ROWS", small_rows)
    as_before_segments(filled_file)
    history.sessions(filled_file, cache=True)
    history.tool_calls(filled_file, cache=True)
    children: list[str] = []
    real_child = store_query._in_child

    def child(path: Path, sql: str, params: object) -> object:
        children.append(sql)
        return real_child(path, sql, params)  # type: ignore[arg-type]

    monkeypatch.setattr(store_query, "_in_child", child)
    record(filled_file, "new", butler="health", at=T0 + timedelta(days=6), calls=3)
    warm = (history.sessions(filled_file, cache=True), history.tool_calls(filled_file, cache=True))
    direct = (
        history.sessions(filled_file, cache=False),
        history.tool_calls(filled_file, cache=False),
    )
    for got, want in zip(warm, direct, strict=True):
        pd.testing.assert_frame_equal(got, want)
    assert list(warm[1]["session_id"]).count("new") == 3
    # cache=False read everything through the child (2 queries); the warm reads did not...
    # unless no tail counts as small, when their tails went there too.
    assert len(children) == (2 if small_rows else 4)


def test_a_change_to_completed_history_makes_the_cache_stale(filled_file: SessionStore) -> None:
    history.sessions(filled_file, cache=True)
    history.tool_calls(filled_file, cache=True)
    conn = sqlite3.connect(filled_file.path)
    with conn:
        conn.execute("UPDATE sessions SET butler = 'renamed' WHERE id = 'a'")
        conn.execute("DELETE FROM tool_calls WHERE session_id = 'c'")
    conn.close()
    assert history.sessions(filled_file, cache=True).loc[0, "butler"] == "renamed"
    assert "c" not in set(history.tool_calls(filled_file, cache=True)["session_id"])
    # A store deleted and made again at the same path is another store.
    filled_file.close()
    filled_file.path.unlink()
    for suffix in ("-wal", "-shm"):
        filled_file.path.with_name(filled_file.path.name + suffix).unlink(missing_ok=True)
    with SessionStore(filled_file.path) as fresh:
        record(fresh, "z", butler="health")
        assert list(history.sessions(fresh, cache=True)["session_id"]) == ["z"]


def test_a_store_is_migrated_to_schema_5_with_its_history_untouched(tmp_path: Path) -> None:
    from spawnkit.store import SCHEMA_VERSION

    path = tmp_path / "old.db"
    with SessionStore(path) as store:
        record(store, "a", butler="health")
    conn = sqlite3.connect(path)
    for name in ("history_epoch", "history_files", "history_lines", "history_usage"):
        conn.execute(f"DROP TABLE {name}")
    for kind in ("session_update", "session_delete", "call_update", "call_delete"):
        conn.execute(f"DROP TRIGGER history_epoch_{kind}")
    conn.execute("ALTER TABLE sessions DROP COLUMN permissions")  # schema 15's
    conn.execute("ALTER TABLE sessions DROP COLUMN network_denied")  # schema 14's
    conn.execute("ALTER TABLE sessions DROP COLUMN owner_seal")  # schema 13's
    conn.execute("DROP INDEX sessions_lease")  # schema 12's
    conn.execute("ALTER TABLE sessions DROP COLUMN lease_until")
    conn.execute("DROP TABLE cli_events")  # schema 11's
    conn.execute("DROP TABLE cli_spans")  # schema 10's
    conn.execute("ALTER TABLE sessions DROP COLUMN attempts")  # schema 9's
    conn.execute("ALTER TABLE sessions DROP COLUMN budget")  # schema 8's
    conn.execute("ALTER TABLE sessions DROP COLUMN kind")  # schema 7's
    conn.execute("ALTER TABLE sessions DROP COLUMN sources")
    conn.execute("ALTER TABLE sessions DROP COLUMN workspace")  # schema 6's
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()
    assert len(history.sessions(path, cache=True)) == 1  # read-only: works unmigrated
    with SessionStore(path):
        pass
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    triggers = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    conn.close()
    assert {"history_epoch_session_update", "history_epoch_call_delete"} <= triggers
    assert list(history.sessions(path, cache=True)["session_id"]) == ["a"]


def test_sessions_are_found_by_id_prefix_whatever_their_age(store: SessionStore) -> None:
    for i in range(30):
        record(store, f"{i:04d}-x", butler="health", at=T0 + timedelta(minutes=i), calls=0)
    assert [r.id for r in store.sessions_with_prefix("0000")] == ["0000-x"]
    assert len(store.sessions_with_prefix("00", limit=2)) == 2
    assert store.sessions_with_prefix("9") == [] and store.sessions_with_prefix("") == []


def test_a_server_and_a_file_give_the_same_frames(filled: SessionStore, tmp_path: Path) -> None:
    """The same history written to both backends reads back as the same frames: columns,
    dtypes, values and filters (a server orders tool calls by session id, then call)."""
    with SessionStore(tmp_path / "twin.db") as twin:
        fill(twin)
        for filters in ({}, {"butler": "general"}, {"since": T0 + timedelta(days=1)},
                        {"status": ["failed"], "success": False}, {"kind": "ask"}):  # fmt: skip
            pd.testing.assert_frame_equal(
                history.sessions(filled, **filters),  # type: ignore[arg-type]
                history.sessions(twin, **filters),  # type: ignore[arg-type]
            )
            calls = [
                history.tool_calls(store, output=True, **filters).sort_values(  # type: ignore[arg-type]
                    ["session_id", "seq"], ignore_index=True
                )
                for store in (filled, twin)
            ]
            pd.testing.assert_frame_equal(*calls)
        assert len(history.tool_calls(filled)) == 7
    assert history.sessions(filled.source).equals(history.sessions(filled))  # path or URL


def test_categories_are_those_present_sorted_as_pandas_would() -> None:
    """The frames' categoricals keep the categories present, sorted (the same frame from the
    database and from the segments): done on Arrow's dictionaries, one per chunk (segment),
    checked against pandas' own rule."""
    import pyarrow as pa

    from spawnkit.history.arrow_frames import Handed, frame

    rng = np.random.default_rng(7)
    names = np.array(["mcp__b__x", "Bash", "Read", "zeta", "Édit", "a", "Write"], dtype=object)
    for sizes in ((0,), (1,), (50, 0, 7), (5000, 3000)):
        chunks, values = [], []
        for n, size in enumerate(sizes):  # each chunk its own dictionary, in its own order
            part = names[rng.integers(n, n + 4, size) % len(names)].astype(object)
            part[rng.random(size) < 0.1] = None
            dictionary = pa.array(list(names[::-1] if n % 2 else names))
            positions = {v: i for i, v in enumerate(dictionary.to_pylist())}
            indices = pa.array([None if v is None else positions[v] for v in part], pa.int32())
            chunks.append(pa.DictionaryArray.from_arrays(indices, dictionary))
            values.extend(part)
        column = pa.chunked_array(chunks, pa.dictionary(pa.int32(), pa.string()))
        got = frame(Handed(pa.table({"tool": column})), ["tool"])["tool"]
        want = pd.Series(pd.Categorical(values), name="tool")
        want = want.cat.reorder_categories(sorted(want.cat.categories))
        pd.testing.assert_series_equal(got, want)


def test_costs_are_filled_in_a_column_arrow_lent_read_only() -> None:
    """Costs are written into the frame's own column; one pyarrow lent without a copy
    (no nulls: a NaN value) is read-only, and is copied then rather than failing."""
    import pyarrow as pa

    from spawnkit.history.pricing import default_pricing
    from spawnkit.history.store_frames import _TOKENS, _fill_costs

    table = pa.table({
        "model": pa.array(["claude-sonnet-4-5", "claude-sonnet-4-5"]).dictionary_encode(),
        "cost_usd": pa.array([0.5, float("nan")]),
        **{name: pa.array([1000, 1000], pa.int64()) for name in _TOKENS},
    })  # fmt: skip
    frame = table.to_pandas(split_blocks=True, self_destruct=True)
    _fill_costs(frame, default_pricing())
    assert frame["cost_usd"].iloc[0] == 0.5 and frame["cost_usd"].iloc[1] > 0
    assert list(frame["cost_source"]) == ["reported", "computed"]


def test_importing_history_loads_no_parquet_worker_pool_or_sweep() -> None:
    """``import spawnkit.history`` is in every read's peak memory: ``pyarrow.parquet``, the
    transcript worker pool (multiprocessing, asyncio) and ``containment.sweep`` (8 MB
    resident together) load when a file is written, transcripts are parsed in workers or
    a store is opened, not before."""
    import json
    import subprocess
    import sys

    later = ("pyarrow.parquet", "multiprocessing", "spawnkit.history.workers",
             "spawnkit.containment.sweep")  # fmt: skip
    probe = (
        "import json, sys, spawnkit.history\n"
        f"print(json.dumps([m for m in {later!r} if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []
