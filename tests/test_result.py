"""The JSON shape of results and tool calls (``--json``, the store's columns, the MCP tool)."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime, timedelta

from spawnkit.result import Attempt, BudgetReport, SpawnerResult, ToolCall, Usage

AT = datetime(2026, 11, 27, 8, 0, tzinfo=UTC)


def _call(n: int, finished: bool = True) -> ToolCall:
    call = ToolCall.start(f"toolu_{n}", "mcp__health__state_get", {"key": "w", "n": [n]}, AT)
    return call.finish("72.4 kg", n % 2 == 1, AT + timedelta(seconds=n)) if finished else call


def _dataclass_shape(value: object) -> object:
    """What ``dataclasses.asdict`` gives, with datetimes as ISO text (the documented shape)."""
    return json.loads(json.dumps(asdict(value), default=datetime.isoformat))  # type: ignore[call-overload]


def test_a_tool_call_has_the_shape_of_its_fields() -> None:
    for call in (_call(1), _call(2, finished=False)):
        assert call.to_dict() == _dataclass_shape(call)
        assert json.loads(json.dumps(call.to_dict())) == call.to_dict()


def test_a_result_has_the_shape_of_its_fields() -> None:
    result = SpawnerResult(
        output="done", tool_calls=[_call(1), _call(2), _call(3, finished=False)],
        success=False, error="boom", session_id="s1", duration_ms=1200,
        usage=Usage(10, 20, 30, 40), cost_usd=0.5, status="failed", num_turns=3,
        budget=BudgetReport(limits={"max_turns": 5.0}, tokens=60, stopped_by="max_turns"),
        attempts=(
            Attempt(1, AT, AT + timedelta(seconds=1), "rate_limit", "slow down", 2.0),
            Attempt(2, AT + timedelta(seconds=3), AT + timedelta(seconds=4), "ok"),
        ),
    )  # fmt: skip
    data = result.to_dict()
    assert data == _dataclass_shape(result)
    assert data["usage"] == {
        "input_tokens": 10, "output_tokens": 20, "cache_read_tokens": 30, "cache_write_tokens": 40,
    }  # fmt: skip
    assert data["attempts"][0]["started_at"] == AT.isoformat()
    for attempt in result.attempts:
        assert attempt.to_dict() == _dataclass_shape(attempt)
        assert Attempt.from_dict(attempt.to_dict()) == attempt
    assert SpawnerResult().to_dict()["budget"] is None


def test_the_dict_is_the_callers_to_change() -> None:
    call = _call(1)
    data = call.to_dict()
    data["input"]["key"] = "changed"
    assert call.input["key"] == "w"
    result = SpawnerResult(tool_calls=[call])
    result.to_dict()["tool_calls"].append("x")
    assert result.to_dict()["tool_calls"] == [call.to_dict()]
