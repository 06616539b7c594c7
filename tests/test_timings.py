"""The timing classifier on log events the real CLIs sent.

``fixtures/telemetry/log_events.json`` holds the log events Claude Code 2.1, Codex 0.169
and Gemini 0.61 exported to a run's receiver for one replayed run of three model turns
(a shell command, an MCP tool, a final answer), their attributes as stored (resource
attributes and opaque ids dropped to keep it small). Each CLI's model requests and
tool calls must be found, with the duration the CLI gave, and nothing else; stored as the
receiver stores them, ``spawnkit.history`` must give the same figures as the live ones, and a
waterfall of Claude Code's recorded spans (``claude_spans.json``) their depths.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spawnkit import history
from spawnkit.cli.console import EventPrinter
from spawnkit.errors import HistoryError
from spawnkit.events import Finished, Started, Timing
from spawnkit.notebook.terminal import TerminalView
from spawnkit.result import SpawnerResult
from spawnkit.store import SessionStore
from spawnkit.telemetry.timings import (
    Measurement,
    RunTimings,
    classify,
    percentile,
    span_kind,
    timing_line,
)

EVENTS: dict[str, list[dict[str, Any]]] = json.loads(
    (Path(__file__).parent / "fixtures" / "telemetry" / "log_events.json").read_text()
)
# What each CLI calls the replayed shell command and the butler's MCP tool.
TOOLS = {
    "claude-code": ["Bash", "mcp_tool"],  # Claude Code hides MCP tool names by default
    "codex": ["exec_command", "mcp__health__state_get"],
    "gemini": ["run_shell_command", "mcp_health_state_get"],
}
MODEL = {"claude-code": "api_request", "codex": "codex.api_request",
         "gemini": "gemini_cli.api_response"}  # fmt: skip


def measured(runtime: str) -> list[Measurement]:
    found = [classify(e["name"], e["attributes"], e["time_ns"]) for e in EVENTS[runtime]]
    return [m for m in found if m is not None]


@pytest.mark.parametrize("runtime", sorted(EVENTS))
def test_each_cli_requests_and_tool_calls_are_found(runtime: str) -> None:
    found = measured(runtime)
    requests = [m for m in found if m.kind == "model"]
    tools = [m for m in found if m.kind == "tool"]
    sent = [e for e in EVENTS[runtime] if e["name"] == MODEL[runtime]]
    assert len(requests) == len(sent) == 3  # three model turns were replayed
    assert [m.duration_ms for m in requests] == [
        float(e["attributes"]["duration_ms"]) for e in sent
    ]
    assert all(m.status == "ok" and m.name not in ("", "?") for m in requests)
    assert [m.name for m in tools] == TOOLS[runtime]
    assert all(m.status == "ok" and m.duration_ms > 0 for m in tools)
    # Every measurement is one of the CLI's request or tool events; decisions, prompts,
    # SSE chunks (Codex's carry a duration_ms too) and Gemini's duration-less
    # api_request are not.
    assert len(found) == 5
    times = [m.time_ns for m in found]
    assert times == sorted(times) and times[0] > 0


def test_tokens_and_time_to_first_token_when_the_cli_says() -> None:
    claude = [m for m in measured("claude-code") if m.kind == "model"]
    assert all(m.input_tokens and m.output_tokens for m in claude)
    assert all(m.ttft_ms is not None and m.ttft_ms <= m.duration_ms for m in claude)
    gemini = [m for m in measured("gemini") if m.kind == "model"]
    assert all(m.input_tokens and m.output_tokens for m in gemini)
    codex = [m for m in measured("codex") if m.kind == "model"]
    assert [m.attempt for m in codex] == [0, 0, 0]


def test_errors_and_failed_tools() -> None:
    # Claude Code's api_error (documented shape) and a failed tool, Codex's HTTP 500.
    error = classify(
        "api_error",
        {"model": "claude-x", "error": "overloaded", "status_code": "529",
         "duration_ms": "812", "attempt": "2"},
    )  # fmt: skip
    assert error is not None and (error.kind, error.status, error.attempt) == ("model", "error", 2)
    failed = classify("tool_result", {"tool_name": "Bash", "success": "false", "duration_ms": 5})
    assert failed is not None and failed.status == "error"
    codex = classify("codex.api_request", {"duration_ms": "40", "http.response.status_code": 500})
    assert codex is not None and codex.status == "error"
    assert classify("tool_result", {"tool_name": "Bash"}) is None  # no duration
    assert classify("tool_result", {"tool_name": "Bash", "duration_ms": "n/a"}) is None
    assert classify("codex.sse_event", {"duration_ms": "3"}) is None


def test_running_percentiles_agree_with_pandas() -> None:
    rng = random.Random(19)
    values = [rng.uniform(5, 5000) for _ in range(41)]
    run = RunTimings("s1")
    timing: Timing | None = None
    for i, value in enumerate(values):
        timing = run.add(Measurement("model", "m", value, "ok"))
        seen = pd.Series(values[: i + 1])
        assert timing.requests == i + 1
        assert timing.p50_ms == pytest.approx(seen.quantile(0.5))
        assert timing.p90_ms == pytest.approx(seen.quantile(0.9))
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.9) == 7.0


def test_tool_totals_rank_the_tools_and_the_line_shows_them() -> None:
    run = RunTimings("s1")
    for m in measured("codex"):
        timing = run.add(m)
    tools = {t.tool: t for t in timing.tools}
    for m in measured("codex"):
        if m.kind == "tool":
            assert tools[m.name].calls == 1
            assert tools[m.name].total_ms == m.duration_ms
    totals = [t.total_ms for t in timing.tools]
    assert totals == sorted(totals, reverse=True)
    line = timing_line(timing)
    assert line.startswith("model 3 requests · p50 ")
    assert all(name in line for name in TOOLS["codex"])
    more = run.add(Measurement("tool", "a", 1, "ok"))
    more = run.add(Measurement("tool", "b", 1, "ok"))
    assert timing_line(more, top=2).endswith("+2 more")
    assert timing_line(RunTimings("s2").add(Measurement("tool", "x", 12_345, "ok"))) == (
        "tools x 12.3 s (1)"
    )


def test_span_kinds() -> None:
    assert span_kind("claude_code.llm_request") == "model"
    assert span_kind("llm_call") == "model"
    assert span_kind("claude_code.tool") == "tool"
    assert span_kind("tool_call") == "tool"
    assert span_kind("claude_code.interaction") is None


SPANS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "fixtures" / "telemetry" / "claude_spans.json").read_text()
)


def recorded_run(store: SessionStore, sid: str, runtime: str, butler: str = "health") -> None:
    """A finished run whose CLI's recorded log events (and, for Claude Code, spans) are
    stored as the receiver stores them."""
    store.create_session(
        sid, butler=butler, runtime=runtime, model=None, prompt="p", context=None,
        trigger_source="external",
    )  # fmt: skip
    store.record_cli_events(
        [{"session_id": sid, "kind": "log", "name": e["name"], "service": runtime,
          "time_ns": e["time_ns"], "trace_id": None, "span_id": None, "value": None,
          "attributes": e["attributes"]} for e in EVENTS[runtime]]
    )  # fmt: skip
    if runtime == "claude-code":
        store.record_cli_spans([{**s, "session_id": sid, "reparented": False} for s in SPANS])


def test_history_frames_from_the_stored_events(store: SessionStore) -> None:
    for runtime in sorted(EVENTS):
        recorded_run(store, f"run-{runtime}", runtime)
    recorded_run(store, "other", "gemini", butler="finance")
    frame = history.timings(store=store)
    live = {runtime: RunTimings(runtime) for runtime in EVENTS}
    for runtime in EVENTS:
        for m in measured(runtime):
            last = live[runtime].add(m)
        rows = frame[frame["session_id"] == f"run-{runtime}"]
        assert sorted(rows["duration_ms"]) == sorted(m.duration_ms for m in measured(runtime))
        assert (rows["runtime"] == runtime).all() and (rows["butler"] == "health").all()
        latency = history.request_latency(frame=rows, by="session_id")
        assert latency["p50_ms"].iloc[0] == pytest.approx(last.p50_ms)
        assert latency["p90_ms"].iloc[0] == pytest.approx(last.p90_ms)
    health = history.timings(store=store, butler="health")
    assert set(health["session_id"]) == {f"run-{r}" for r in EVENTS}
    assert set(history.timings(store=store, butler="health", runs=1)["session_id"]) <= set(
        health["session_id"]
    )
    tools = history.tool_times(store=store)
    gemini_shell = tools[tools["tool"] == "run_shell_command"].iloc[0]
    durations = frame[frame["name"] == "run_shell_command"]["duration_ms"]
    assert (gemini_shell["runs"], gemini_shell["calls"]) == (2, 2)  # health's and finance's
    assert gemini_shell["total_ms"] == durations.sum()
    assert gemini_shell["p90_ms"] == pytest.approx(durations.quantile(0.9))
    assert tools["total_ms"].is_monotonic_decreasing
    by_runtime = history.request_latency(store=store, by="runtime")
    assert by_runtime.set_index("runtime")["requests"].to_dict() == {
        "claude-code": 3, "codex": 3, "gemini": 6,
    }  # fmt: skip


def test_a_waterfall_of_claude_codes_spans(store: SessionStore) -> None:
    recorded_run(store, "run", "claude-code")
    bars = history.waterfall("run", store=store)
    assert len(bars) == len(SPANS)
    by_name = bars.groupby("name")["depth"].unique().to_dict()
    assert list(by_name["claude_code.interaction"]) == [0]  # right under the run's span
    assert list(by_name["claude_code.llm_request"]) == [1]
    assert list(by_name["claude_code.tool"]) == [1]
    assert list(by_name["claude_code.tool.execution"]) == [2]
    assert bars["start_ms"].iloc[0] == 0.0 and bars["start_ms"].is_monotonic_increasing
    assert (bars["kind"] == "model").sum() == 3 and (bars["kind"] == "tool").sum() == 2
    first = min(SPANS, key=lambda s: s["start_ns"])
    assert bars["duration_ms"].iloc[0] == (first["end_ns"] - first["start_ns"]) / 1e6
    assert len(history.waterfall("run", store=store, min_duration_ms=30)) == sum(
        (s["end_ns"] - s["start_ns"]) >= 30e6 for s in SPANS
    )
    figure = history.plot_waterfall(bars, title="one run")
    (axes,) = figure.axes
    assert len(axes.patches) == len(bars)
    assert [t.get_text().strip() for t in axes.get_yticklabels()] == bars["name"].tolist()


def test_the_terminal_views_print_the_last_timing_before_the_summary() -> None:
    run = RunTimings("s1")
    timings = [run.add(m) for m in measured("gemini")]
    events: list[Any] = [
        Started("s1", "health", "gemini", "gemini-2.5-flash", None),
        *timings,
        Finished("s1", SpawnerResult(output="done", session_id="s1", butler="health")),
    ]
    printed, terminal = io.StringIO(), io.StringIO()
    printer, view = EventPrinter(printed), TerminalView(terminal, status_line=False)
    for event in events:
        printer(event)
        view(event)
    view.drain(final=True)
    for out in (printed.getvalue(), terminal.getvalue()):
        lines = out.splitlines()
        (at,) = [n for n, line in enumerate(lines) if line.startswith("⏱ ")]
        assert lines[at] == f"⏱ {timing_line(timings[-1])}"  # the last, with every figure
        assert lines[at + 1].startswith("✓ success") and at + 2 == len(lines)
    assert view.state.status.timing == timing_line(timings[-1])


@pytest.mark.parametrize(
    "read",
    [
        lambda path: history.waterfall("any", path),
        lambda path: history.timings(store=path),
        lambda path: history.spans(path),
        lambda path: history.cli_events(path),
    ],
    ids=["waterfall", "timings", "spans", "cli_events"],
)
def test_a_path_with_no_store_is_an_error_and_no_store_is_made(tmp_path: Path, read: Any) -> None:
    mistyped = tmp_path / "sesions.db"
    with pytest.raises(HistoryError, match=r"no session store at .*sesions\.db"):
        read(mistyped)
    assert list(tmp_path.iterdir()) == []
