"""The live view's state: constant work per event, bounded memory, coalesced sends."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from spawnkit.events import (
    AssistantText,
    Finished,
    Queued,
    Started,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from spawnkit.notebook.view import RunView
from spawnkit.notebook.view_state import SNAPSHOT_ROWS, ViewState
from spawnkit.result import SpawnerResult, ToolCall, Usage

T0 = datetime(2026, 11, 22, tzinfo=UTC)


def call(i: int) -> ToolCall:
    return ToolCall.start(f"c{i}", "mcp__health__state_get", {"key": f"k{i}"}, T0)


def test_batches_carry_only_what_changed() -> None:
    state = ViewState()
    state.apply(Queued("s", "health", 2))
    first = state.take_batch()
    assert first is not None and first["status"]["state"] == "queued"
    assert first["status"]["queue_position"] == 2
    assert state.take_batch() is None, "nothing changed, nothing to send"
    state.apply(Started("s", "health", "claude-code", "m", "r"))
    state.apply(ToolCallStarted("s", call(1)))
    state.apply(TextDelta("s", "Hel"))
    state.apply(TextDelta("s", "lo"))
    state.apply(AssistantText("s", "Hello"))
    state.apply(ToolCallFinished("s", call(1).finish("72 kg", False, T0)))
    batch = state.take_batch()
    assert batch is not None
    assert [(r["id"], r["status"], r["output"]) for r in batch["rows"]] == [("c1", "ok", "72 kg")]
    assert batch["text"] == "Hello\n\n", "streamed text is not repeated by the finished block"
    assert batch["status"]["state"] == "running" and batch["status"]["tool_calls"] == 1
    assert batch["seq"] == first["seq"] + 1


def test_memory_is_bounded() -> None:
    state = ViewState(max_rows=50, max_text=1000)
    for i in range(5000):
        state.apply(ToolCallStarted("s", call(i)))
        state.apply(TextDelta("s", "x" * 10))
        state.take_batch()
    assert len(state.rows) == 50 and state.dropped_rows == 4950
    assert len(state.text) <= 2000
    assert state.status.tool_calls == 5000
    snapshot = state.snapshot()
    assert len(snapshot["rows"]) == min(50, SNAPSHOT_ROWS)
    assert snapshot["dropped_rows"] >= 4950


def test_finish_and_usage() -> None:
    state = ViewState()
    state.apply(UsageUpdate("s", Usage(100, 20, 5, 0), 0.01, 2))
    assert state.status.input_tokens == 100 and state.status.turns == 2
    state.apply(ToolCallStarted("s", call(1)))
    result = SpawnerResult(
        success=False, status="cancelled", error="the run was cancelled",
        tool_calls=[call(1).finish("[not finished]", True, T0)], usage=Usage(1, 2, 3, 4),
    )  # fmt: skip
    state.apply(Finished("s", result))
    batch = state.take_batch()
    assert batch is not None
    assert batch["status"]["state"] == "cancelled"
    assert batch["status"]["error"] == "the run was cancelled"
    assert batch["rows"][0]["status"] == "error"
    assert "cancelled" in state.render_text()


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
    assert len(custom) == 1 and len(custom[0]["content"]["rows"]) == 100
    view.handle(Finished("s", SpawnerResult(session_id="s")))
    updates = [m for m in comm.messages if m["method"] == "update"]
    assert updates and updates[-1]["state"]["snapshot"]["status"]["state"] == "success"
    bundle, _ = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == RunView.FALLBACK_TEXT
    assert "success" in view.text(), "the text rendering follows the run"
