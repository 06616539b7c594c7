"""One naming rule for every history frame, and the old names kept one release with a warning.

``session_id`` names the session in every frame, ``name`` what a span or event is called,
and a fact has one column name wherever it appears (``started_at``, ``timestamp``,
``parent_span_id``), so frames join without renaming. ``spans()``, ``cli_events()``,
``timings()`` and ``waterfall()`` still answer to the names they had before, with a
``DeprecationWarning`` that names the new column (:mod:`spawnkit.history.renamed`).
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest

from spawnkit import history
from spawnkit.store import SessionStore

from .test_timings import EVENTS, recorded_run

FIXTURES = Path(__file__).parent / "fixtures" / "history"
OLD_NAMES = {
    "spans": {"session": "session_id", "span": "name", "parent": "parent_span_id",
              "start": "started_at"},
    "cli_events": {"session": "session_id", "time": "timestamp"},
    "timings": {"session": "session_id", "time": "timestamp"},
    "waterfall": {"span": "name", "parent": "parent_span_id"},
}  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    """Runs of the three CLIs with their stored log events, and Claude Code's spans."""
    with SessionStore(tmp_path / "sessions.db") as opened:
        for runtime in sorted(EVENTS):
            recorded_run(opened, f"run-{runtime}", runtime)
        yield opened


def frames(store: SessionStore) -> dict[str, pd.DataFrame]:
    """Every public frame of spawnkit.history that has rows per session, by name."""
    loaded = history.transcripts("claude", root=FIXTURES / "claude", cache=False)
    return {
        "sessions": history.sessions(store),
        "tool_calls": history.tool_calls(store),
        "spans": history.spans(store),
        "cli_events": history.cli_events(store),
        "timings": history.timings(store),
        "transcripts.sessions": loaded.sessions,
        "transcripts.tool_calls": loaded.tool_calls,
        "transcripts.usage": loaded.usage,
        "transcripts.events": loaded.events,
        "transcripts.files": loaded.files,
    }


def test_every_frame_calls_the_session_session_id(store: SessionStore) -> None:
    for name, frame in frames(store).items():
        assert "session_id" in frame.columns, name
        assert "session" not in frame.columns, name
    for columns in (history.SPAN_COLUMNS, history.CLI_EVENT_COLUMNS, history.TIMING_COLUMNS):
        assert columns[0] == "session_id"


def test_the_same_fact_has_the_same_name_in_every_frame(store: SessionStore) -> None:
    found = frames(store)
    # What a span, an event, a timed request or a tool call is called.
    for name in ("spans", "cli_events", "timings", "tool_calls", "transcripts.tool_calls"):
        assert "name" in found[name].columns, name
    assert "name" in history.WATERFALL_COLUMNS
    # When a session, tool call or span started; when an event happened.
    for name in ("sessions", "tool_calls", "spans", "transcripts.sessions"):
        assert "started_at" in found[name].columns, name
    for name in ("cli_events", "timings", "transcripts.usage", "transcripts.events"):
        assert "timestamp" in found[name].columns, name
    for name in ("spans", "cli_events"):
        assert {"trace_id", "span_id"} <= set(found[name].columns), name
    assert "parent_span_id" in found["spans"].columns
    assert "parent_span_id" in history.WATERFALL_COLUMNS
    # No frame keeps an old name, nor has a column that is some other frame's old name.
    for name, frame in found.items():
        for old in ("session", "span", "parent", "start", "time"):
            assert old not in frame.columns, (name, old)


def test_spans_join_sessions_on_session_id(store: SessionStore) -> None:
    spans, sessions = history.spans(store), history.sessions(store)
    assert len(spans) > 0
    joined = spans.merge(sessions[["session_id", "butler", "runtime"]], on="session_id")
    assert len(joined) == len(spans)
    assert set(joined["runtime"]) == {"claude-code"} and set(joined["butler"]) == {"health"}
    events = history.cli_events(store).merge(sessions, on="session_id", how="left")
    assert events["butler"].notna().all()
    per_run = history.timings(store).groupby("session_id").size()
    assert set(per_run.index) == set(sessions["session_id"])


def old_name_frames(store: SessionStore) -> dict[str, pd.DataFrame]:
    return {
        "spans": history.spans(store),
        "cli_events": history.cli_events(store),
        "timings": history.timings(store),
        "waterfall": history.waterfall("run-claude-code", store=store),
    }


def test_old_names_still_read_the_same_data_with_a_warning(store: SessionStore) -> None:
    for kind, frame in old_name_frames(store).items():
        assert len(frame) > 0, kind
        for old, new in OLD_NAMES[kind].items():
            with pytest.warns(DeprecationWarning, match=f"'{old}' is now '{new}'") as caught:
                by_item = frame[old]
            assert caught[0].filename == __file__  # the warning points at the user's line
            pd.testing.assert_series_equal(by_item, frame[new])
            with pytest.warns(DeprecationWarning, match=f"'{new}'"):
                by_attribute = getattr(frame, old)
            pd.testing.assert_series_equal(by_attribute, frame[new])
            with pytest.warns(DeprecationWarning, match=f"'{new}'"):
                listed = frame[[old, "kind" if "kind" in frame else new]]
            assert listed.columns[0] == new


def test_old_names_follow_the_frame_through_pandas(store: SessionStore) -> None:
    spans, sessions = history.spans(store), history.sessions(store)
    derived: list[Callable[[pd.DataFrame], pd.DataFrame]] = [
        lambda f: f[f["duration_ms"] >= 0],
        lambda f: f.copy(),
        lambda f: f.head(3),
        lambda f: f.assign(seconds=f["duration_ms"] / 1000),
        lambda f: f.reset_index(drop=True),
        lambda f: pd.concat([f, f]),
        lambda f: f.merge(sessions, on="session_id"),
        lambda f: pickle.loads(pickle.dumps(f)),
    ]
    for make in derived:
        with pytest.warns(DeprecationWarning, match="'span' is now 'name'"):
            assert make(spans)["span"].notna().all()
    with pytest.warns(DeprecationWarning, match="'session_id'"):
        sizes = spans.groupby("session").size()
    assert sizes.to_dict() == {"run-claude-code": len(spans)}
    with pytest.warns(DeprecationWarning, match="'started_at'"):
        ordered = spans.sort_values("start")
    assert ordered["started_at"].is_monotonic_increasing
    with pytest.warns(DeprecationWarning, match="'session_id'"):
        joined = spans.merge(sessions, left_on="session", right_on="session_id")
    assert len(joined) == len(spans)
    timings = history.timings(store)
    with pytest.warns(DeprecationWarning, match="'session_id'") as caught:
        latency = history.request_latency(frame=timings, by="session")
    assert caught[0].filename == __file__
    assert list(latency.columns[:1]) == ["session_id"]
    assert set(latency["session_id"]) == set(timings["session_id"])


def test_new_names_and_columns_of_ones_own_never_warn(store: SessionStore) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spans = history.spans(store)
        spans[["session_id", "name", "parent_span_id", "started_at"]]
        spans.groupby("session_id").size()
        mine = spans.assign(session="mine")  # a column the user made is theirs
        assert (mine["session"] == "mine").all()
        with pytest.raises(KeyError):
            spans["no such column"]
        with pytest.raises(AttributeError):
            _ = spans.no_such_column
        # Only the frame's own old names: a timing never had a "span" column.
        with pytest.raises(KeyError):
            history.timings(store)["span"]
