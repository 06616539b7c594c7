"""Where a run's time went, from the agent CLIs' own telemetry (CLI telemetry on).

``timings()``: one row per model request and per tool call, as the CLI's log events
reported them (:mod:`spawnkit.telemetry.timings` reads Claude Code's, Codex's and Gemini's event
names), with the run's butler and runtime. ``tool_times()``: time per tool across runs
(calls, total, p50, p90). ``request_latency()``: model request latency per butler, model
or run. ``waterfall(session_id)``: one run's spans as bars (start offset from the run's
start, duration, name, depth under the run's span), ready for ``plot_waterfall()``.
Column names follow the history frames' one rule (docs/history.md); the old ones still work
for a release (:mod:`spawnkit.history.renamed`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..store import SessionRecord, SessionStore
from ..telemetry.timings import classify, span_kind
from .renamed import new_key, with_old_names
from .span_frames import existing_store

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TIMING_COLUMNS = [
    "session_id", "butler", "runtime", "timestamp", "kind", "name", "duration_ms", "status",
    "input_tokens", "output_tokens", "ttft_ms", "attempt",
]  # fmt: skip
TOOL_TIME_COLUMNS = ["tool", "runs", "calls", "total_ms", "mean_ms", "p50_ms", "p90_ms", "errors"]
LATENCY_COLUMNS = ["requests", "mean_ms", "p50_ms", "p90_ms", "max_ms", "errors"]
WATERFALL_COLUMNS = [
    "name", "kind", "start_ms", "duration_ms", "end_ms", "depth", "service", "status",
    "span_id", "parent_span_id",
]  # fmt: skip
# The columns' names before the one naming rule (docs/history.md), answered until the next
# release with a DeprecationWarning (:mod:`spawnkit.history.renamed`).
TIMING_OLD_NAMES = {"session": "session_id", "time": "timestamp"}
WATERFALL_OLD_NAMES = {"span": "name", "parent": "parent_span_id"}


def _sessions(
    store: SessionStore, session_id: str | None, butler: str | None, runs: int | None
) -> list[SessionRecord]:
    if session_id is not None:
        found = store.get_session(session_id)
        return [found] if found is not None else []
    return store.list_sessions(butler=butler, limit=runs if runs is not None else 1_000_000)


def _events(
    store: SessionStore, records: Sequence[SessionRecord], every: bool
) -> Iterator[tuple[SessionRecord, dict[str, Any]]]:
    """Each record's stored CLI events: one query for all of them when ``every`` run is
    wanted, else one per run."""
    if every:
        by_id = {r.id: r for r in records}
        for event in store.cli_events():
            if event["session_id"] in by_id:
                yield by_id[event["session_id"]], event
        return
    for record in records:
        for event in store.cli_events(record.id):
            yield record, event


def _timing_rows(
    store: SessionStore, records: Sequence[SessionRecord], every: bool
) -> list[dict[str, Any]]:
    rows = []
    for record, event in _events(store, records, every):
        measured = (
            classify(event["name"], event["attributes"], event["time_ns"])
            if event["kind"] == "log"
            else None
        )
        if measured is None:
            continue
        rows.append(
            {
                "session_id": record.id,
                "butler": record.butler,
                "runtime": record.runtime,
                "timestamp": measured.time_ns,
                "kind": measured.kind,
                "name": measured.name,
                "duration_ms": measured.duration_ms,
                "status": measured.status,
                "input_tokens": measured.input_tokens,
                "output_tokens": measured.output_tokens,
                "ttft_ms": measured.ttft_ms,
                "attempt": measured.attempt,
            }
        )
    return rows


def timings(
    store: SessionStore | str | Path | None = None,
    session_id: str | None = None,
    *,
    butler: str | None = None,
    runs: int | None = None,
) -> pd.DataFrame:
    """Every model request (``kind == "model"``, ``name`` the model) and tool call
    (``kind == "tool"``, ``name`` the tool) the CLIs reported, by session and time.

    Of one run (``session_id``), of one butler's runs, or of the last ``runs`` runs
    (of ``butler``); ``store`` is a :class:`SessionStore`, or a path or URL opened and
    closed here.
    """
    every = session_id is None and butler is None and runs is None
    if isinstance(store, SessionStore):
        rows = _timing_rows(store, _sessions(store, session_id, butler, runs), every)
    else:
        with existing_store(store) as opened:
            rows = _timing_rows(opened, _sessions(opened, session_id, butler, runs), every)
    frame = pd.DataFrame(rows, columns=TIMING_COLUMNS)
    frame["timestamp"] = pd.to_datetime(frame["timestamp"].astype("int64"), unit="ns", utc=True)
    for column in ("input_tokens", "output_tokens", "attempt"):
        frame[column] = frame[column].astype("Int64")
    for column in ("duration_ms", "ttft_ms"):
        frame[column] = frame[column].astype("float64")
    ordered = frame.sort_values(["session_id", "timestamp"], kind="stable")
    return with_old_names(ordered.reset_index(drop=True), TIMING_OLD_NAMES)


def _summary(durations: pd.Series, statuses: pd.Series) -> dict[str, Any]:
    return {
        "mean_ms": float(durations.mean()),
        "p50_ms": float(durations.quantile(0.5)),
        "p90_ms": float(durations.quantile(0.9)),
        "errors": int((statuses == "error").sum()),
    }


def tool_times(
    store: SessionStore | str | Path | None = None,
    session_id: str | None = None,
    *,
    butler: str | None = None,
    runs: int | None = None,
    frame: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Time per tool across runs: in how many runs, calls, total, mean, p50 and p90 (ms),
    failed calls; most total time first. ``frame`` reuses a :func:`timings` frame."""
    found = timings(store, session_id, butler=butler, runs=runs) if frame is None else frame
    tools = found[found["kind"] == "tool"]
    rows = [
        {
            "tool": tool,
            "runs": int(group["session_id"].nunique()),
            "calls": len(group),
            "total_ms": float(group["duration_ms"].sum()),
            **_summary(group["duration_ms"], group["status"]),
        }
        for tool, group in tools.groupby("name", sort=False)
    ]
    table = pd.DataFrame(rows, columns=TOOL_TIME_COLUMNS)
    return table.sort_values(["total_ms", "tool"], ascending=[False, True]).reset_index(drop=True)


def request_latency(
    store: SessionStore | str | Path | None = None,
    session_id: str | None = None,
    *,
    butler: str | None = None,
    runs: int | None = None,
    by: str | Sequence[str] = "butler",
    frame: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Model request latency grouped ``by`` (``butler``, ``runtime``, ``name`` (the model)
    or ``session_id``): requests, mean, p50, p90 and max (ms), failed requests."""
    found = timings(store, session_id, butler=butler, runs=runs) if frame is None else frame
    keys = []
    for key in [by] if isinstance(by, str) else by:  # a loop: the warning names the caller
        keys.append(new_key(found, key, TIMING_OLD_NAMES))
    requests = found[found["kind"] == "model"]
    rows = [
        {
            **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
            "requests": len(group),
            **_summary(group["duration_ms"], group["status"]),
            "max_ms": float(group["duration_ms"].max()),
        }
        for key, group in requests.groupby(keys, sort=True)
    ]
    return pd.DataFrame(rows, columns=[*keys, *LATENCY_COLUMNS])


def waterfall(
    session_id: str,
    store: SessionStore | str | Path | None = None,
    *,
    min_duration_ms: float = 0.0,
) -> pd.DataFrame:
    """One run's CLI spans as a waterfall, in order of start.

    ``start_ms`` counts from the run's start (or its first span, if earlier); ``depth`` is
    0 for a span right under the run's span; ``kind`` says which spans are a model request
    or a tool call. Spans shorter than ``min_duration_ms`` are left out (Codex sends
    hundreds of tiny ones); depths still count them.
    """
    if isinstance(store, SessionStore):
        record, stored = store.get_session(session_id), store.cli_spans(session_id)
    else:
        with existing_store(store) as opened:
            record, stored = opened.get_session(session_id), opened.cli_spans(session_id)
    parents: dict[str, str | None] = {s["span_id"]: s["parent_span_id"] for s in stored}

    def depth(span_id: str) -> int:
        found, seen = 0, {span_id}
        parent = parents.get(span_id)
        while parent is not None and parent in parents and parent not in seen:
            seen.add(parent)
            found += 1
            parent = parents[parent]
        return found

    starts = [s["start_ns"] for s in stored]
    if record is not None and record.started_at is not None:
        starts.append(int(record.started_at.timestamp() * 1e9))
    origin = min(starts) if starts else 0
    rows = []
    for s in stored:
        duration = max(0, s["end_ns"] - s["start_ns"]) / 1e6
        if duration < min_duration_ms:
            continue
        start = (s["start_ns"] - origin) / 1e6
        rows.append(
            {
                "name": s["name"],
                "kind": span_kind(s["name"]),
                "start_ms": start,
                "duration_ms": duration,
                "end_ms": start + duration,
                "depth": depth(s["span_id"]),
                "service": s["service"],
                "status": s["status"],
                "span_id": s["span_id"],
                "parent_span_id": s["parent_span_id"],
            }
        )
    frame = pd.DataFrame(rows, columns=WATERFALL_COLUMNS)
    for column in ("start_ms", "duration_ms", "end_ms"):
        frame[column] = frame[column].astype("float64")
    frame["depth"] = frame["depth"].astype("int64")
    ordered = frame.sort_values(["start_ms", "depth"], kind="stable").reset_index(drop=True)
    return with_old_names(ordered, WATERFALL_OLD_NAMES)


_COLOURS = {"model": "tab:blue", "tool": "tab:orange"}


def plot_waterfall(frame: pd.DataFrame, title: str | None = None) -> Figure:
    """A :func:`waterfall` frame as a horizontal bar chart (matplotlib): one bar per span,
    indented by depth, model requests blue, tool calls orange, the rest grey."""
    from matplotlib.figure import Figure  # the notebook extra

    figure = Figure(figsize=(9, max(2.0, 0.25 * len(frame) + 1)))
    axes = figure.subplots()
    rows = list(range(len(frame)))
    axes.barh(
        rows,
        frame["duration_ms"],
        left=frame["start_ms"],
        color=[_COLOURS.get(str(kind), "tab:gray") for kind in frame["kind"]],
    )
    labels = ["   " * int(d) + str(s) for d, s in zip(frame["depth"], frame["name"], strict=True)]
    axes.set_yticks(rows, labels, family="monospace", fontsize=8)
    # Left-aligned, so the indentation shows the depth (about 5 points a character at 8 pt).
    axes.tick_params(axis="y", pad=5 * max((len(label) for label in labels), default=0) + 4)
    for tick in axes.get_yticklabels():
        tick.set_horizontalalignment("left")
    axes.set_xlim(left=0)
    axes.invert_yaxis()
    axes.set_xlabel("ms since the run started")
    if title:
        axes.set_title(title)
    figure.tight_layout()
    return figure
