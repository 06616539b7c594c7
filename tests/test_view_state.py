"""The run view's state: an ordered transcript, an accurate header, bounded memory, few sends."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from spawnkit.containment.egress import NOT_LISTED
from spawnkit.events import (
    AssistantText,
    Finished,
    NetworkDenied,
    Queued,
    Started,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from spawnkit.notebook.static_view import static_html, static_text
from spawnkit.notebook.view import RunView
from spawnkit.notebook.view_state import (
    PREVIEW_CHARS,
    SNAPSHOT_ITEMS,
    ViewState,
    estimate_cost,
    format_duration,
)
from spawnkit.result import SpawnerResult, ToolCall, Usage
from spawnkit.store import SessionStore

T0 = datetime(2026, 11, 22, tzinfo=UTC)


def call(i: int, name: str = "mcp__health__state_get", **input: Any) -> ToolCall:
    return ToolCall.start(f"c{i}", name, dict(input) or {"key": f"k{i}"}, T0)


def done(c: ToolCall, output: str, error: bool = False, ms: int = 35) -> ToolCall:
    return c.finish(output, error, T0 + timedelta(milliseconds=ms))


def test_the_transcript_keeps_the_order_things_happened_in() -> None:
    state = ViewState()
    state.apply(Started("s", "health", "claude-code", None, "r", max_turns=20))
    state.apply(TextDelta("s", "Reading the "))
    state.apply(TextDelta("s", "log first."))
    state.apply(AssistantText("s", "Reading the log first."))
    first = call(1)
    state.apply(ToolCallStarted("s", first))
    state.apply(ToolCallFinished("s", done(first, '{"found":false,"value":null}')))
    state.apply(AssistantText("s", "Now the date."))
    bash = call(2, "Bash", command="date +%F", description="today")
    state.apply(ToolCallStarted("s", bash))
    state.apply(ToolCallFinished("s", done(bash, "2026-11-22\n", ms=46)))
    state.apply(AssistantText("s", "## Done\n\n| day | kg |\n|---|---|\n| mon | 72.4 |"))
    kinds = [(item["kind"], item["id"]) for item in state.items.values()]
    assert kinds == [
        ("text", "text-1"), ("tool", "c1"), ("text", "text-2"), ("tool", "c2"), ("text", "text-3"),
    ]  # fmt: skip
    batch = state.take_batch()
    assert batch is not None
    sent = [item["id"] for item in batch["items"]]
    assert sent == ["text-1", "c1", "text-2", "c2", "text-3"], "new items go out in order"
    text = {item["id"]: item for item in batch["items"]}
    assert text["text-1"]["html"] == "<p>Reading the log first.</p>\n", "deltas shown once"
    assert "<h2>Done</h2>" in text["text-3"]["html"] and "<td>72.4</td>" in text["text-3"]["html"]
    mcp, shell = text["c1"], text["c2"]
    assert (mcp["label"], mcp["summary"]) == ("health.state_get", '{"key": "k1"}')
    assert mcp["result"] == '{"found":false,"value":null}', "a one-line preview of the result"
    assert mcp["output"] == '{\n  "found": false,\n  "value": null\n}', "JSON pretty-printed"
    assert json.loads(mcp["input"]) == {"key": "k1"} and "\n  " in mcp["input"]
    assert (shell["label"], shell["summary"]) == ("Bash", "$ date +%F"), "a shell is `$ command`"
    assert (shell["duration"], shell["output_lines"]) == ("46 ms", 2)


def test_the_header_says_what_the_run_waits_on_and_counts_right() -> None:
    state = ViewState()
    state.apply(Queued("s", "health", 2))
    assert state.status.waiting() == "waiting for a slot (position 2)"
    assert state.status.mark == "◷"
    state.apply(Started("s", "health", "claude-code", None, "r", max_turns=20))
    assert state.status.waiting() == "waiting on the model"
    state.apply(UsageUpdate("s", Usage(100, 1, 50, 10), None, 1, "claude-sonnet-4-5"))
    state.apply(TextDelta("s", "Looking"))
    assert state.status.waiting() == "the model is writing"
    state.apply(UsageUpdate("s", Usage(100, 120, 50, 10), None, 1, "claude-sonnet-4-5"))
    bash = call(1, "Bash", command="sleep 1")
    state.apply(ToolCallStarted("s", bash))
    assert state.status.waiting() == "running Bash"
    state.apply(ToolCallFinished("s", done(bash, "boom", error=True)))
    ok = call(2)
    state.apply(ToolCallStarted("s", ok))
    state.apply(ToolCallFinished("s", done(ok, "fine")))
    state.apply(UsageUpdate("s", Usage(300, 200, 150, 10), None, 3, "claude-sonnet-4-5"))
    header = state.status.as_dict()
    assert header["waiting"] == "waiting on the model"
    assert (header["turns"], header["max_turns"], header["model"]) == (3, 20, "claude-sonnet-4-5")
    assert (header["tool_calls"], header["failed_tools"]) == (2, 1)
    assert (header["input_tokens"], header["output_tokens"]) == (300, 200)
    assert (header["cache_read_tokens"], header["cache_write_tokens"]) == (150, 10)
    expected = estimate_cost("claude-sonnet-4-5", Usage(300, 200, 150, 10))
    assert expected is not None and header["cost_usd"] == expected and header["cost_estimated"]
    figures = header["figures"]
    assert figures[:3] == ["turn 3/20", "2 tool calls (1 failed)", "300 in / 200 out tokens"]
    assert figures[3] == "cache 150 read / 10 write" and figures[4] == f"≈${expected:.4f}"
    assert "claude-sonnet-4-5" in header["who"]
    result = SpawnerResult(
        success=True, usage=Usage(300, 210, 150, 10), cost_usd=0.5, duration_ms=1234,
        num_turns=3, tool_calls=[done(bash, "boom", error=True), done(ok, "fine")],
    )  # fmt: skip
    state.apply(Finished("s", result))
    header = state.status.as_dict()
    assert header["state"] == "success" and header["mark"] == "✓" and header["waiting"] is None
    assert header["elapsed_s"] == 1.23, "one duration: the result's"
    assert header["figures"][-1] == "$0.5000" and not header["cost_estimated"]
    assert header["failed_tools"] == 1, "a success with a failed tool still counts it"


def test_failed_and_cancelled_runs_keep_their_error() -> None:
    state = ViewState()
    state.apply(ToolCallStarted("s", call(1)))
    result = SpawnerResult(
        success=False, status="cancelled", error="the run was cancelled", error_kind="cancelled",
        tool_calls=[done(call(1), "[not finished]", error=True)], usage=Usage(1, 2, 3, 4),
    )  # fmt: skip
    state.apply(Finished("s", result))
    batch = state.take_batch()
    assert batch is not None
    assert batch["header"]["state"] == "cancelled" and batch["header"]["mark"] == "■"
    assert batch["header"]["error"] == "the run was cancelled"
    assert batch["items"][0]["status"] == "error"
    assert "error: the run was cancelled" in static_text(state)


def test_memory_and_messages_are_bounded() -> None:
    state = ViewState(max_items=50, max_text=1000)
    for i in range(5000):
        state.apply(ToolCallStarted("s", call(i)))
        state.apply(TextDelta("s", "x" * 10))
        state.take_batch()
    assert len(state.items) == 50 and state.dropped == 9950
    assert state.status.tool_calls == 5000
    snapshot = state.snapshot()
    assert len(snapshot["items"]) == min(50, SNAPSHOT_ITEMS)
    assert snapshot["dropped"] >= 9950
    big = ViewState()
    long_call = call(1)
    big.apply(ToolCallStarted("s", long_call))
    big.apply(ToolCallFinished("s", done(long_call, "line\n" * 3000)))
    batch = big.take_batch()
    assert batch is not None
    (row,) = batch["items"]
    assert len(row["output"]) == PREVIEW_CHARS and row["output_more"] == 15000 - PREVIEW_CHARS
    assert big.full_output("c1") == "line\n" * 3000, "the rest is kept for 'show all'"


def test_a_long_streaming_answer_is_rendered_less_often() -> None:
    state = ViewState()
    state.apply(TextDelta("s", "word " * 3000))
    assert state.take_batch() is not None
    segment = state._segments["text-1"]
    segment.render_cost = 10.0  # as if rendering took ten seconds
    state.apply(TextDelta("s", "more"))
    batch = state.take_batch()
    assert batch is not None and batch["items"] == [], "the header goes, the text waits"
    state.apply(AssistantText("s", "word " * 3000 + "more"))
    batch = state.take_batch()
    assert batch is not None and "more" in batch["items"][0]["html"], "a closed block renders"


def test_markdown_is_safe_html() -> None:
    state = ViewState()
    state.apply(AssistantText("s", "<script>alert(1)</script>\n\n[x](javascript:alert)"))
    html = state.transcript()[0]["html"]
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<a " in html and 'href="javascript' not in html


def test_static_view_shows_the_transcript_in_order() -> None:
    state = ViewState()
    state.apply(Started("s", "health", "claude-code", "m", "r", max_turns=5))
    state.apply(AssistantText("s", "First **this**."))
    bash = call(1, "Bash", command="echo <hi>")
    state.apply(ToolCallStarted("s", bash))
    state.apply(ToolCallFinished("s", done(bash, "<hi>")))
    state.apply(AssistantText("s", "Then that."))
    state.apply(Finished("s", SpawnerResult(session_id="s", duration_ms=2500)))
    page = static_html(state)
    assert page.index("<strong>this</strong>") < page.index("$ echo &lt;hi&gt;")
    assert page.index("$ echo &lt;hi&gt;") < page.index("Then that.")
    assert "<style>" in page and "<hi>" not in page
    assert 'data-state="success"' in page and "2.5 s" in page
    text = static_text(state)
    assert re.search(r"First \*\*this\*\*\.\n.*✓ Bash  \$ echo <hi>\n.*<hi>\n  Then that\.", text)


def test_a_result_alone_becomes_a_finished_view() -> None:
    result = SpawnerResult(
        output="## Answer", tool_calls=[done(call(1), "ok")], session_id="s", butler="health",
        runtime="codex", model="gpt", duration_ms=900,
    )  # fmt: skip
    state = ViewState.from_result(result)
    assert [item["kind"] for item in state.transcript()] == ["tool", "text"]
    assert state.status.who() == "health · codex · gpt" and state.status.state == "success"
    assert "<h2>Answer</h2>" in static_html(state)


def test_durations_read_the_same_everywhere() -> None:
    assert [format_duration(x) for x in (None, 35, 1234, 185_000)] == [
        "", "35 ms", "1.2 s", "3 min 5 s",
    ]  # fmt: skip


class Comm:
    comm_id = "test"
    kernel = "test"

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self.messages.append(json.loads(json.dumps(data)))

    def close(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_msg(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_run_view_coalesces_into_one_message_per_flush() -> None:
    scheduled: list[Any] = []
    view = RunView(schedule=lambda delay, callback: scheduled.append((delay, callback)))
    comm = Comm()
    view.comm = comm
    for i in range(100):
        view.handle(ToolCallStarted("s", call(i)))
    assert len(scheduled) == 1, "one flush is scheduled however many events arrive"
    assert scheduled[0][0] == 0.05
    scheduled.pop()[1]()
    custom = [m for m in comm.messages if m["method"] == "custom"]
    assert len(custom) == 1 and len(custom[0]["content"]["items"]) == 100
    bundle, _ = view._repr_mimebundle_()
    assert bundle["text/plain"] == RunView.FALLBACK_TEXT, "fixed words while it runs"
    view.handle(ToolCallFinished("s", done(call(7), "x" * 5000)))
    view._on_frontend_message(view, {"kind": "full_output", "id": "c7"}, [])
    reply = comm.messages[-1]["content"]
    assert reply == {"kind": "full_output", "id": "c7", "text": "x" * 5000}
    view.handle(Finished("s", SpawnerResult(session_id="s")))
    updates = [m for m in comm.messages if m["method"] == "update"]
    assert updates and updates[-1]["state"]["snapshot"]["header"]["state"] == "success"
    bundle, _ = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" not in bundle, "no model to miss later"
    assert bundle["text/plain"].startswith("✓ success"), "the snapshot once it has ended"
    assert 'class="spawnkit-run sk-static"' in bundle["text/html"]


def test_a_refused_connection_is_a_row_in_order_and_the_end_says_what_to_add() -> None:
    state = ViewState()
    state.apply(Started("s", "fetcher", "codex", None, "r"))
    state.apply(AssistantText("s", "Installing."))
    pip = call(1, "Bash", command="pip install <requests>")
    state.apply(ToolCallStarted("s", pip))
    config = "roster/fetcher/butler.toml"
    state.apply(NetworkDenied("s", "<pypi.org>", 443, NOT_LISTED, "Bash", "c1", config))
    state.apply(ToolCallFinished("s", done(pip, "error: 403")))
    live = state.take_batch()
    assert live is not None and live["header"]["hint"] is None, "the hint comes at the end"
    assert "1 connection blocked" in live["header"]["figures"]
    rows = [(item["kind"], item.get("text")) for item in state.items.values()]
    assert rows == [
        ("text", None), ("tool", None),
        ("notice", "blocked: connect <pypi.org>:443 (not in allow_hosts) · during Bash"),
    ]  # fmt: skip
    state.apply(Finished("s", SpawnerResult(session_id="s", network_denied=1)))
    hint = (
        'hint: 1 connection blocked; to allow them, add "<pypi.org>" to '
        "[butler.sandbox] allow_hosts in roster/fetcher/butler.toml"
    )
    assert state.status.as_dict()["hint"] == hint
    text = static_text(state)
    assert "  ⛔ blocked: connect <pypi.org>:443 (not in allow_hosts) · during Bash" in text
    assert hint in text.splitlines()
    html = static_html(state)
    assert '<div class="sk-item sk-notice">blocked: connect &lt;pypi.org&gt;:443' in html
    assert '<div class="sk-hint">hint: 1 connection blocked; to allow them, add &quot;' in html


def test_a_view_of_a_record_shows_its_count_of_refusals() -> None:
    state = ViewState.from_result(SpawnerResult(session_id="s", network_denied=2))
    assert "2 connections blocked" in state.status.figures()
    assert state.status.hint == (
        "hint: 2 connections blocked (not allowed by [butler.sandbox] allow_hosts in the "
        "butler's butler.toml)"
    )
    assert ViewState.from_result(SpawnerResult(session_id="t")).status.hint is None


def test_the_dashboard_shows_a_recorded_run_with_its_refusals(tmp_path: Path) -> None:
    from spawnkit.notebook.widgets import record_result  # ipywidgets: only this test needs it

    with SessionStore(tmp_path / "sessions.db") as store:
        store.create_session(
            "s", butler="fetcher", runtime="codex", model=None, prompt="p", context=None,
            trigger_source="api",
        )  # fmt: skip
        store.complete_session("s", SpawnerResult(session_id="s", network_denied=2))
        record = store.get_session("s")
    assert record is not None
    html = static_html(ViewState.from_result(record_result(record)))
    assert "2 connections blocked" in html and 'class="sk-hint"' in html
