"""The Codex and Gemini output parsers on lines recorded from the real CLIs.

The fixtures in tests/fixtures/runtimes/ are stdout logs of real runs (through
the replay server): a run with an MCP call and a shell command, and a run
whose model call failed. Variants below cut, interleave and corrupt them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spawnkit.errors import RuntimeCrashed
from spawnkit.events import (
    AssistantText,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    UsageUpdate,
)
from spawnkit.runtimes.base import classify_failure
from spawnkit.runtimes.codex import CodexParser
from spawnkit.runtimes.gemini import GeminiParser
from spawnkit.runtimes.streaming import LineParser

FIXTURES = Path(__file__).parent / "fixtures" / "runtimes"


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def feed(parser: LineParser, source: list[str]) -> list[RunEvent]:
    events: list[RunEvent] = []
    for line in source:
        events.extend(parser.feed(line))
    return events


def test_codex_run_with_tools() -> None:
    parser = CodexParser("s1", "health")
    events = feed(parser, lines("codex_tools.jsonl"))
    started = [e.call for e in events if isinstance(e, ToolCallStarted)]
    finished = [e.call for e in events if isinstance(e, ToolCallFinished)]
    assert [(c.name, c.server, c.tool) for c in started] == [
        ("mcp__health__state_get", "health", "state_get"),
        ("shell", None, "shell"),
    ]
    assert started[0].input == {"key": "weight"}
    assert [c.status for c in finished] == ["ok", "error"], "exit 3 makes the shell call fail"
    assert '"found":false' in (finished[0].output or "").replace(" ", "")
    assert "hello" in (finished[1].output or "")
    assert next(e.text for e in events if isinstance(e, AssistantText)) == "Looking."
    outcome = parser.outcome(0, [])
    assert outcome.success and outcome.output.startswith("Done:")
    assert outcome.runtime_session_id and parser.runtime_session_id == outcome.runtime_session_id
    raw = next(json.loads(x) for x in lines("codex_tools.jsonl") if '"turn.completed"' in x)[
        "usage"
    ]
    usage = outcome.usage
    assert usage.cache_read_tokens == raw["cached_input_tokens"] == 120, "the scenario's 50 + 70"
    assert usage.output_tokens == raw["output_tokens"]
    assert usage.input_tokens == raw["input_tokens"] - raw["cached_input_tokens"]
    assert parser.bad_lines == 0 and parser.tool_calls == 2


@pytest.mark.parametrize("cut", ["turn.completed", "everything"])
def test_codex_exiting_0_without_a_result_is_a_failure(cut: str) -> None:
    parser = CodexParser("s1", "health")
    recorded = [x for x in lines("codex_tools.jsonl") if '"turn.completed"' not in x]
    feed(parser, recorded if cut == "turn.completed" else [])
    outcome = parser.outcome(0, [])
    assert not outcome.success
    assert outcome.error_kind == "crash"
    assert outcome.error == (
        "codex exited with code 0 without completing its turn (no turn.completed event)"
    )
    if cut == "turn.completed":
        assert outcome.output == "Looking.\n\nDone: hello", "what it said is kept"


def test_codex_failed_turn() -> None:
    parser = CodexParser("s1", "health")
    feed(parser, lines("codex_error.jsonl"))
    outcome = parser.outcome(1, ["Reading additional input from stdin..."])
    assert not outcome.success
    assert outcome.error_kind == "overloaded"
    error = outcome.error or ""
    assert "529" in error and "retry in a minute" in error, "an overload is waited out"
    assert "base_url" not in error and "127.0.0.1" not in error, "no wrong hint, no address"


def test_gemini_run_with_tools() -> None:
    parser = GeminiParser("s1", "health")
    events = feed(parser, lines("gemini_tools.jsonl"))
    started = [e.call for e in events if isinstance(e, ToolCallStarted)]
    assert [(c.name, c.server, c.tool) for c in started] == [
        ("mcp__health__state_get", "health", "state_get"),
        ("run_shell_command", None, "run_shell_command"),
    ]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Looking.", "Done: hello"]
    assert [e.text for e in events if isinstance(e, AssistantText)] == ["Looking.", "Done: hello"]
    assert isinstance(events[-1], UsageUpdate)
    outcome = parser.outcome(0, [])
    assert outcome.success and outcome.output == "Done: hello"
    assert outcome.model == "gemini-2.5-flash"
    stats = json.loads(lines("gemini_tools.jsonl")[-1])["stats"]
    assert outcome.usage.input_tokens == stats["input"] == stats["input_tokens"] - stats["cached"]
    assert outcome.usage.cache_read_tokens == stats["cached"]


def test_gemini_model_error_and_exit_codes() -> None:
    parser = GeminiParser("s1", "health")
    feed(parser, lines("gemini_error.jsonl"))
    outcome = parser.outcome(17, [])
    assert not outcome.success and outcome.error_kind == "overloaded"
    assert "Overloaded" in (outcome.error or "")
    limited = GeminiParser("s1", "health")
    assert limited.outcome(53, []).error_kind == "max_turns"
    auth = GeminiParser("s1", "health")
    auth.feed(json.dumps({"type": "error", "severity": "error", "message": "API key not valid"}))
    failed = auth.outcome(41, [])
    assert failed.error_kind == "auth" and "GEMINI_API_KEY" in (failed.error or "")


@pytest.mark.parametrize("parser_class", [CodexParser, GeminiParser])
def test_silence_and_a_crash_is_a_crash(parser_class: type[LineParser]) -> None:
    parser = parser_class("s1", "health")
    with pytest.raises(RuntimeCrashed, match="exited with code 137"):
        parser.outcome(137, [])


@pytest.mark.parametrize("name", ["codex_tools.jsonl", "gemini_tools.jsonl"])
def test_garbage_truncated_and_interleaved_lines(name: str) -> None:
    clean_parser = (
        CodexParser("s", "health") if name.startswith("codex") else GeminiParser("s", "health")
    )
    clean = feed(clean_parser, lines(name))
    source = lines(name)
    noisy = [
        "Reading additional input from stdin...",  # stray text
        source[0][: len(source[0]) // 2],  # a line cut in half
        "[1, 2, 3]",  # JSON, but not an object
        "",
        *source,
        '{"type": "item.completed", "item": {"type": "mystery"}}',  # unknown item
        '{"type": "unheard-of"}',
    ]
    parser = CodexParser("s", "health") if name.startswith("codex") else GeminiParser("s", "health")
    events = feed(parser, noisy)
    assert parser.bad_lines == 3
    kept = [
        type(e).__name__ for e in events if not isinstance(e, ToolCallStarted | ToolCallFinished)
    ]
    assert kept == [
        type(e).__name__ for e in clean if not isinstance(e, ToolCallStarted | ToolCallFinished)
    ]
    assert parser.outcome(0, []).success


@pytest.mark.parametrize(
    ("status", "text", "kind", "hint"),
    [
        (
            529,
            "API Error: 529 Overloaded. This is a server-side issue, usually temporary — try "
            "again in a moment. If it persists, check your inference gateway (127.0.0.1:40455).",
            "overloaded",
            "overloaded: this is temporary",
        ),
        (
            None,
            "unexpected status 529: Overloaded, url: http://127.0.0.1:1/v1",
            "overloaded",
            "overloaded",
        ),
        (None, "API Error: 500 Internal server error", "model_unavailable", "failed on its side"),
        (
            None,
            "API Error: Connection error.",
            "model_unavailable",
            "check [butler.runtime] base_url",
        ),
        (None, "unexpected status 503 Service Unavailable: busy", "overloaded", "temporary"),
        (429, "Too many requests", "rate_limit", "rate limiting"),
        (401, "Invalid API key", "auth", "LOG IN"),
    ],
)
def test_failures_get_the_hint_of_their_kind(
    status: int | None, text: str, kind: str, hint: str
) -> None:
    failure = classify_failure(status, text, auth_remedy="LOG IN")
    assert failure.kind == kind and hint in str(failure)
    assert "127.0.0.1" not in str(failure) and "http" not in str(failure)
    assert str(failure).count("(") == 1, "one statement and one hint"
