"""End to end: each real CLI's telemetry becomes Timing events while the run happens.

Claude Code, Codex and Gemini run for real against the replay model server with
``[butler.telemetry] cli = "all"``: a shell command that takes a few seconds, a call of the
butler's MCP tool, an answer. The run's listener must get a Timing for each of the three
model requests and the two tool calls, with durations that fit inside the run, the first
one while the slow command is still running (Claude Code exports its log events every
second as spawnkit sets it, Codex about as often, Gemini every 5 s: its command sleeps
longer); and ``history.timings()``, ``tool_times()``, ``request_latency()`` and
``waterfall()`` must show the same requests and calls from the store afterwards. A last
test runs Claude Code from a notebook hub: the live view's state, its saved snapshot, the
terminal printer and the butler's dashboard card show the timings.
"""

from __future__ import annotations

import html
import io
import time
import tomllib
from pathlib import Path

import pytest

from spawnkit import history
from spawnkit.cli.console import EventPrinter
from spawnkit.events import Finished, RunEvent, Timing, ToolCallFinished
from spawnkit.notebook.hub import Hub, Target
from spawnkit.notebook.static_view import static_html, static_text
from spawnkit.notebook.view_state import ViewState, format_duration
from spawnkit.notebook.widgets import ButlerDashboard
from spawnkit.replay import Scenario
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore

from .test_cli_telemetry_e2e import runtime  # noqa: F401 - the fixture: all three CLIs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# How long the first command sleeps: longer than each CLI's log export interval, with margin.
SLOW_S = {"claude-code": 4, "codex": 4, "gemini": 12}
SCRIPT = """
[[turn]]
shell = "sleep {slow}; echo slept"
[[turn]]
tool = "mcp__*__state_get"
input = {{ key = "weight" }}
[[turn]]
text = "Done."
"""
TOOLS = {
    "claude-code": {"Bash", "mcp_tool"},
    "codex": {"exec_command", "mcp__health__state_get"},
    "gemini": {"run_shell_command", "mcp_health_state_get"},
}


async def test_timings_arrive_during_the_run(
    make_butler,
    runtime: str,  # noqa: F811 - the imported fixture
    isolated_home: Path,
) -> None:
    # "all": the waterfall below is drawn from the spans, not in Codex's default set.
    butler = make_butler(extra='[butler.telemetry]\ncli = "all"\n').with_runtime(runtime)
    store = SessionStore()
    script = SCRIPT.format(slow=SLOW_S[runtime])
    scenario = Scenario.from_dict(tomllib.loads(script), source="<timings>")
    events: list[tuple[float, RunEvent]] = []
    clock = time.monotonic()
    async with ButlerService(butler, store=store, replay=scenario) as svc:
        result = await svc.trigger(
            "time it", on_event=lambda e: events.append((time.monotonic() - clock, e))
        )
    assert result.success, result.error
    timings = [(at, e) for at, e in events if isinstance(e, Timing)]
    kinds = [e.kind for _, e in timings]
    assert kinds.count("model") == 3, kinds
    assert {e.name for _, e in timings if e.kind == "tool"} == TOOLS[runtime]
    (finished_at,) = [at for at, e in events if isinstance(e, Finished)]
    assert all(at < finished_at for at, _ in timings)
    # The first model request is reported while the slow command still runs.
    slow_done = min(at for at, e in events if isinstance(e, ToolCallFinished))
    assert timings[0][0] < slow_done, (timings[0][0], slow_done)

    assert all(e.session_id == result.session_id for _, e in timings)
    assert all(0 < e.duration_ms < result.duration_ms for _, e in timings)
    slow = [e for _, e in timings if e.kind == "tool" and e.duration_ms >= SLOW_S[runtime] * 1000]
    assert len(slow) == 1, [(e.name, e.duration_ms) for _, e in timings]
    last = timings[-1][1]
    assert last.requests == 3 and last.p50_ms is not None and last.p90_ms is not None
    assert 0 < last.p50_ms <= last.p90_ms
    assert last.tools[0].tool == slow[0].name  # the slow command has the most time
    assert {t.tool for t in last.tools} == TOOLS[runtime]

    frame = history.timings(store=store, session_id=result.session_id)
    live = sorted((e.kind, e.name, e.duration_ms) for _, e in timings)
    assert sorted(zip(frame["kind"], frame["name"], frame["duration_ms"], strict=True)) == live
    assert set(frame["runtime"]) == {butler.runtime.type}
    tools = history.tool_times(store=store, butler=butler.name, runs=20)
    assert set(tools["tool"]) == TOOLS[runtime]
    assert tools["calls"].tolist() == [1, 1]
    assert tools.iloc[0]["tool"] == slow[0].name
    assert tools.iloc[0]["total_ms"] == slow[0].duration_ms
    latency = history.request_latency(store=store, butler=butler.name)
    assert latency["requests"].tolist() == [3]
    assert latency["p50_ms"].iloc[0] == pytest.approx(last.p50_ms)
    assert latency["p90_ms"].iloc[0] == pytest.approx(last.p90_ms)

    bars = history.waterfall(result.session_id, store=store)
    assert len(bars) == len(store.cli_spans(result.session_id)) > 0
    assert (bars["start_ms"] >= 0).all() and (bars["duration_ms"] >= 0).all()
    assert bars["start_ms"].is_monotonic_increasing
    assert (bars["depth"] == 0).any() and (bars["kind"] == "model").any()
    assert bars["end_ms"].max() <= result.duration_ms + 1000  # inside the run (clock slack)


QUICK = """
[[turn]]
shell = "echo hi"
[[turn]]
tool = "mcp__*__state_get"
input = { key = "weight" }
[[turn]]
text = "Done."
"""


def test_the_views_and_the_dashboard_show_the_timings(
    store: SessionStore, make_butler, tmp_path: Path
) -> None:
    """A real Claude Code run from a notebook hub: the live view's header, its saved
    snapshot, the terminal printer and the butler's dashboard card show the timings."""
    butler = make_butler(extra="[butler.telemetry]\ncli = true\n").with_runtime("claude-code")
    scenario = tmp_path / "quick.toml"
    scenario.write_text(QUICK)
    state, printed = ViewState(), io.StringIO()
    hub = Hub(store)
    dashboard = ButlerDashboard(butler.roster_dir, hub=hub, refresh_s=3600)
    try:
        handle = hub.start(
            Target(butler, replay=scenario), "time it",
            listeners=[state.apply, EventPrinter(printed)],
        )  # fmt: skip
        result = handle.result(timeout=120)
        assert result.success, result.error
        hub.loop.submit(dashboard.refresh()).future.result(timeout=30)
        card = dashboard.cards[butler.name].timing.value
    finally:
        dashboard.close()
        hub.close()
    line = state.status.timing
    assert line is not None and line.startswith("model 3 requests · p50 "), line
    assert "Bash" in line and "mcp_tool" in line
    assert state.status.as_dict()["timing"] == line  # what the live view's header gets
    assert f'<div class="sk-timing">{html.escape(line)}</div>' in static_html(state)
    assert f"  {line}" in static_text(state)
    lines = printed.getvalue().splitlines()
    (timing_line,) = [n for n, text in enumerate(lines) if text.startswith("⏱ ")]
    assert lines[timing_line] == f"⏱ {line}"
    assert lines[timing_line + 1].startswith("✓ success")  # just before the summary
    frame = history.timings(store=store, butler=butler.name, runs=20)
    latency = history.request_latency(frame=frame)
    assert "model requests (its runs): p50 " in card, card
    assert f"p50 {format_duration(latency['p50_ms'].iloc[0])}" in card
    assert "3 requests" in card
    assert "<td>Bash</td>" in card and "<td>mcp_tool</td>" in card
