"""Terminal rendering is a pure function of events and records."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from spawnkit.cli.console import (
    EventPrinter,
    Style,
    describe_input,
    render_event,
    render_session,
    render_sessions_table,
    render_summary,
    render_tool_call_finished,
    render_tool_call_started,
)
from spawnkit.containment.egress import NOT_LISTED, PRIVATE
from spawnkit.events import (
    Finished,
    NetworkDenied,
    PermissionDecided,
    Queued,
    TextDelta,
    ToolCallStarted,
)
from spawnkit.result import PermissionAnswer, SpawnerResult, ToolCall, Usage
from spawnkit.store.records import SessionRecord

T0 = datetime(2026, 11, 22, 8, 0, tzinfo=UTC)


def call(name: str = "mcp__health__state_get", **input: object) -> ToolCall:
    return ToolCall.start("c1", name, dict(input) or {"key": "weight"}, T0)


def test_tool_call_lines() -> None:
    started = call()
    assert (started.server, started.tool) == ("health", "state_get")
    assert render_tool_call_started(started) == '  ⚙ health.state_get  {"key": "weight"}'
    bash = call("Bash", command="python3   skills/x.py\n--flag", description="d")
    assert describe_input(bash) == "$ python3 skills/x.py --flag", "a shell shows `$ command`"
    done = started.finish("72.4 kg\nmore", False, T0 + timedelta(milliseconds=35))
    assert render_tool_call_finished(done) == "    ✓ 35 ms  72.4 kg more"
    failed = started.finish("", True, T0 + timedelta(milliseconds=1))
    assert render_tool_call_finished(failed) == "    ✗ 1 ms  (no output)"


def test_long_input_is_shortened() -> None:
    line = render_tool_call_started(call(key="x" * 500))
    assert len(line) < 200 and line.endswith("…")


def test_summary_line() -> None:
    result = SpawnerResult(
        output="ok", tool_calls=[call()], duration_ms=1234, usage=Usage(1000, 50, 200, 10),
        cost_usd=0.01234, session_id="abc",
    )  # fmt: skip
    assert render_summary(result) == (
        "✓ success · 1 tool call · 1.2 s · 1,000 in / 50 out tokens (cache 200 read, 10 write)"
        " · $0.0123 · session abc"
    )
    failed = SpawnerResult(success=False, status="cancelled", error="the run was cancelled")
    assert render_summary(failed).splitlines()[-1] == "error: the run was cancelled"
    broken = call().finish("boom", True, T0)
    assert "2 tool calls (1 failed)" in render_summary(SpawnerResult(tool_calls=[call(), broken]))


def test_styles_only_when_enabled() -> None:
    assert "\033[" not in render_summary(SpawnerResult(), Style(False))
    assert "\033[32m" in render_summary(SpawnerResult(), Style(True))


def test_events() -> None:
    assert render_event(Queued("s", "health", 2)) == "… queued for health (position 2)"
    assert render_event(TextDelta("s", "partial")) is None
    assert render_event(ToolCallStarted("s", call())) == render_tool_call_started(call())


def test_sessions_table_handles_empty() -> None:
    assert render_sessions_table([]) == "no sessions recorded yet"


CONFIG = "/home/u/roster/fetcher/butler.toml"


def denied(host: str, reason: str = NOT_LISTED, tool: str | None = "Bash") -> NetworkDenied:
    return NetworkDenied("s", host, 443, reason, tool=tool, tool_call_id="c1", config_file=CONFIG)


def test_a_refused_connection_is_one_line() -> None:
    assert render_event(denied("pypi.org")) == (
        "  ⛔ blocked: connect pypi.org:443 (not in allow_hosts) · during Bash"
    )
    assert render_event(denied("pypi.org", tool=None)) == (
        "  ⛔ blocked: connect pypi.org:443 (not in allow_hosts)"
    )


def test_a_run_with_refusals_ends_with_a_hint_naming_the_key_and_the_file() -> None:
    out = io.StringIO()
    printer = EventPrinter(out)
    printer(ToolCallStarted("s", call("Bash", command="pip install requests")))
    for host in ("pypi.org", "files.pythonhosted.org", "pypi.org"):
        printer(denied(host))
    printer(denied("mirror.internal", PRIVATE))
    printer(Finished("s", SpawnerResult(session_id="s", network_denied=4)))
    lines = out.getvalue().splitlines()
    assert lines[0] == "  ⚙ Bash  $ pip install requests"
    assert lines[1:3] == [
        "  ⛔ blocked: connect pypi.org:443 (not in allow_hosts) · during Bash",
        "  ⛔ blocked: connect files.pythonhosted.org:443 (not in allow_hosts) · during Bash",
    ]
    assert "4 connections blocked" in lines[-2], "the summary counts them"
    assert lines[-1] == (
        'hint: 4 connections blocked; to allow them, add "pypi.org", "files.pythonhosted.org" '
        f"to [butler.sandbox] allow_hosts in {CONFIG}"
    )
    quiet = io.StringIO()
    EventPrinter(quiet)(Finished("t", SpawnerResult(session_id="t")))
    assert "hint" not in quiet.getvalue() and "blocked" not in quiet.getvalue()


def test_permission_answers_are_printed_and_shown_with_the_session() -> None:
    write = call("Write", file_path="/tmp/x")
    answer = PermissionAnswer("c1", "Write", False, "no approver", T0, reason="nobody\nthere")
    assert (
        render_event(PermissionDecided("s", write, answer))
        == "  ? Write: denied (no approver): nobody there"
    )
    record = SessionRecord(
        id="s", butler="b", runtime="claude-code", model=None, prompt="p", context=None,
        trigger_source="external", status="success", success=True, error=None,
        error_kind=None, output="", tool_calls=[write], duration_ms=1, usage=Usage(),
        cost_usd=None, num_turns=1, trace_id=None, runtime_session_id=None,
        parent_session_id=None, created_at=T0, started_at=T0, completed_at=T0,
        permissions=(answer,),
    )  # fmt: skip
    shown = render_session(record)
    assert any(line.split() == ["permissions", "1", "asked"] for line in shown.splitlines())
    assert "    ? Write (c1): denied by no approver" in shown
