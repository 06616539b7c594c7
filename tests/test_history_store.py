"""spawnkit.history.sessions / tool_calls / usage on a store written through SessionStore."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

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
) -> None:
    store.create_session(sid, butler=butler, runtime=runtime, model=model, prompt="p",
                         context=None, trigger_source="external", created_at=at,
                         role=role)  # fmt: skip
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


@pytest.fixture
def filled(store: SessionStore) -> SessionStore:
    record(store, "a", butler="health", cost=0.5, role="researcher")
    record(store, "b", butler="health", at=T0 + timedelta(days=1), success=False, calls=3)
    record(store, "c", butler="general", runtime="codex", model="gpt-5",
           at=T0 + timedelta(days=1, hours=15, minutes=30))  # fmt: skip
    record(store, "d", butler="general", model="no-such-model", at=T0 + timedelta(days=3),
           calls=0)  # fmt: skip
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


def test_a_store_older_than_roles_reads_with_an_empty_role(filled: SessionStore) -> None:
    filled.close()
    conn = sqlite3.connect(filled.path)
    conn.execute("ALTER TABLE sessions DROP COLUMN role")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    frame = history.sessions(filled.path)
    assert len(frame) == 4 and frame["role"].isna().all()


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
