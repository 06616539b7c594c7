"""The Anthropic wire adapter, the recorder's parsing and writing, and the app in process."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, cast

import httpx

from spawnkit.replay import ReplayServer, Scenario
from spawnkit.replay.anthropic import (
    MessagesRequest,
    error_body,
    estimate_usage,
    last_tool_result,
    prompt_text,
    sse_frames,
    system_text,
    to_turn_request,
    tool_names,
    turn_index,
)
from spawnkit.replay.recorder import (
    MessageAssembler,
    RecordedCall,
    RecordedTurn,
    Recording,
    SSEDecoder,
    turn_from_message,
)
from spawnkit.replay.scenario import ErrorSpec, PlannedCall, Reply, TurnRequest, Usage

REMINDER = "<system-reminder>\nAttribution for git commits...\n</system-reminder>\n"

# The shape Claude Code 2.1.330 sends for the second request of a one-tool-call run.
SECOND_REQUEST: dict[str, Any] = {
    "model": "claude-opus-5-5",
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330"},
        {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": REMINDER},
                {"type": "text", "text": "What is my weight?"},
            ],
        },
        {"role": "system", "content": [{"type": "text", "text": "# Environment\n..."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "mcp__health__state_get", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "date"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "81.5 kg"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [{"type": "text", "text": "Mon"}, {"type": "text", "text": "Nov"}],
                },
            ],
        },
    ],
    "tools": [{"name": "Bash", "input_schema": {}}, {"name": "mcp__health__state_get"}],
    "stream": True,
}


def body(data: dict[str, Any]) -> MessagesRequest:
    return cast(MessagesRequest, data)


def parse_sse(frames: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """A deliberately naive SSE reader, independent of the recorder's decoder."""
    events = []
    for frame in "".join(frames).split("\n\n"):
        if not frame:
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_request_parts() -> None:
    request = body(SECOND_REQUEST)
    assert turn_index(request) == 1
    assert prompt_text(request) == "What is my weight?"
    assert tool_names(request) == ("Bash", "mcp__health__state_get")
    assert last_tool_result(request) == "81.5 kg\nMon\nNov"
    assert system_text(request).endswith("You are a Claude agent.")
    first = body({"messages": [{"role": "user", "content": "plain prompt"}]})
    assert to_turn_request(first) == TurnRequest("plain prompt", 0)


def test_reminder_inside_the_prompt_block_is_removed() -> None:
    request = body({"messages": [{"role": "user", "content": REMINDER + "  do it  "}]})
    assert prompt_text(request) == "do it"


def test_sse_frames_for_text_and_two_tool_calls() -> None:
    turn = TurnRequest("p", 2)
    reply = Reply(
        text="Hello world",
        tool_calls=(PlannedCall("Bash", {"command": "ls"}), PlannedCall("mcp__h__g", {})),
        chunk_chars=4,
    )
    usage = estimate_usage(body(SECOND_REQUEST), reply)
    frames = sse_frames(turn, reply, model="m", usage=usage)
    assert all(frame.startswith("event: ") and frame.endswith("\n\n") for frame in frames)
    events = parse_sse(frames)
    names = [name for name, _ in events]
    assert names[0] == "message_start"
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert (start["model"], start["content"], start["stop_reason"]) == ("m", [], None)
    assert set(start["usage"]) >= {"input_tokens", "cache_read_input_tokens"}

    text = "".join(
        data["delta"]["text"]
        for _, data in events
        if data.get("delta", {}).get("type") == "text_delta"
    )
    assert text == "Hello world"
    assert sum(1 for name, _ in events if name == "content_block_delta") >= 3 + 2
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [block["type"] for block in starts] == ["text", "tool_use", "tool_use"]
    assert starts[1]["id"] != starts[2]["id"]
    assert [data["index"] for name, data in events if name == "content_block_stop"] == [0, 1, 2]
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}

    assembler = MessageAssembler()
    decoder = SSEDecoder()
    raw = "".join(frames).encode()
    for offset in range(0, len(raw), 7):  # arbitrary split points, as TCP would
        for event in decoder.feed(raw[offset : offset + 7]):
            assembler.feed(event)
    assert assembler.complete
    assert assembler.turn() == RecordedTurn(
        text="Hello world",
        tool_calls=(RecordedCall("Bash", {"command": "ls"}), RecordedCall("mcp__h__g", {})),
        usage=cast(dict[str, int], usage),
        stop_reason="tool_use",
    )


def test_text_only_turn_ends_the_turn() -> None:
    events = parse_sse(
        sse_frames(
            TurnRequest("p", 0), Reply(text=""), model="m", usage=estimate_usage(body({}), Reply())
        )
    )
    assert [d["content_block"]["type"] for n, d in events if n == "content_block_start"] == ["text"]
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_usage_estimate_and_override() -> None:
    request = body(SECOND_REQUEST)
    estimated = estimate_usage(request, Reply(text="x" * 40))
    assert estimated["output_tokens"] == 10
    assert estimated["input_tokens"] > 50
    assert estimated["cache_read_input_tokens"] == 0
    assert estimate_usage(request, Reply(text="x" * 40)) == estimated  # deterministic
    given = estimate_usage(
        request, Reply(text="x", usage=Usage(input_tokens=7, cache_creation_input_tokens=3))
    )
    assert given["input_tokens"] == 7
    assert given["cache_creation_input_tokens"] == 3
    assert given["output_tokens"] == 1


def test_error_body_shape() -> None:
    assert error_body(ErrorSpec(529, "overloaded_error", "Overloaded")) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }


def test_decoder_handles_crlf_comments_and_multiline_data() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b": ping\r\nevent: a\r\ndata: 1\r\ndata: 2\r\n\r\ndata: x\n")
    assert [(e.event, e.data) for e in events] == [("a", "1\n2")]
    assert [(e.event, e.data) for e in decoder.feed(b"\n")] == [("message", "x")]


def test_turn_from_non_streamed_message() -> None:
    turn = turn_from_message(
        {
            "content": [
                {"type": "thinking", "thinking": "hm"},
                {"type": "text", "text": "a"},
                {"type": "tool_use", "name": "Bash", "input": {"command": "ls"}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 5, "output_tokens": 2},
        }
    )
    assert turn.text == "a"
    assert turn.tool_calls == (RecordedCall("Bash", {"command": "ls"}),)
    assert turn.usage == {"input_tokens": 5, "output_tokens": 2}


def test_recording_writes_a_scenario_that_replays_verbatim(tmp_path: Path) -> None:
    out = tmp_path / "rec" / "out.toml"
    recording = Recording(out, "http://upstream")
    prompt = "Weigh (me) {{now}}?\nline two " + "x" * 100
    first = body({"messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}]})
    recording.add(first, "s1", RecordedTurn(error=ErrorSpec(529, "overloaded_error", "busy")))
    weird_tool = "mcp__h*__get[1]"
    recording.add(
        first,
        "s1",
        RecordedTurn(
            text="Let me {{ check }}",
            tool_calls=(RecordedCall(weird_tool, {"key": "{{w}}", "gone": None, "n": [1, None]}),),
            usage={"input_tokens": 9, "cache_read_input_tokens": 4},
        ),
    )
    # A retry that failed after a success must not replace the success.
    recording.add(first, "s1", RecordedTurn(error=ErrorSpec(500, "api_error", "late")))
    second = body({**first, "messages": [*first["messages"], {"role": "assistant", "content": []}]})
    recording.add(second, "s1", RecordedTurn(text="Done."))
    assert not list(out.parent.glob("*.tmp"))

    scenario = Scenario.load(out)
    assert len(scenario.scripts) == 1
    offered = ("Bash", weird_tool, "mcp__hx__get1")
    reply = scenario.reply(TurnRequest(prompt, 0, offered))
    assert reply.text == "Let me {{ check }}"
    assert reply.tool_calls == (PlannedCall(weird_tool, {"key": "{{w}}", "n": [1]}),)
    assert reply.usage == Usage(input_tokens=9, cache_read_input_tokens=4)
    assert scenario.reply(TurnRequest(prompt, 1, offered)).text == "Done."
    assert "no script" in scenario.reply(TurnRequest("other prompt", 0, offered)).text


async def test_app_streams_logs_and_errors() -> None:
    scenario = Scenario.from_dict(
        {
            "model": "replay-model",
            "script": [
                {
                    "match": "^fail",
                    "turn": [
                        {
                            "error": {
                                "status": 529,
                                "type": "overloaded_error",
                                "message": "Overloaded",
                            }
                        }
                    ],
                },
                {"turn": [{"text": "hi {{ prompt }}", "delay_ms": 150}]},
            ],
        }
    )
    server = ReplayServer(scenario)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replay") as client:
        assert (await client.head("/api/hello")).status_code == 200
        started = time.monotonic()
        streamed = await client.post(
            "/v1/messages?beta=true",
            json={
                "model": "asked",
                "stream": True,
                "messages": [{"role": "user", "content": "yo"}],
            },
            headers={"x-claude-code-session-id": "abc"},
        )
        assert time.monotonic() - started >= 0.15
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = parse_sse([streamed.text])
        assert events[0][1]["message"]["model"] == "replay-model"
        assert events[2][1]["delta"]["text"] == "hi yo"

        plain = await client.post(
            "/v1/messages", json={"messages": [{"role": "user", "content": "yo"}]}
        )
        assert plain.json()["content"] == [{"type": "text", "text": "hi yo"}]

        failed = await client.post(
            "/v1/messages", json={"stream": True, "messages": [{"role": "user", "content": "fail"}]}
        )
        assert failed.status_code == 529
        assert failed.json()["error"]["type"] == "overloaded_error"

        counted = await client.post("/v1/messages/count_tokens", json={"messages": []})
        assert counted.json()["input_tokens"] >= 1
        assert (await client.post("/v1/messages", content=b"nope")).status_code == 400
        assert (await client.get("/v1/models")).status_code == 404

    logged = server.requests
    assert [entry.path for entry in logged][:2] == ["/api/hello", "/v1/messages"]
    assert logged[1].query == "beta=true"
    assert logged[1].headers["x-claude-code-session-id"] == "abc"
    assert logged[1].body["model"] == "asked"


async def test_request_log_is_bounded() -> None:
    server = ReplayServer(Scenario.from_dict({"turn": [{"text": "x"}]}), max_requests=3)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replay") as client:
        for number in range(5):
            await client.post("/v1/messages/count_tokens", json={"n": number})
    assert [entry.body["n"] for entry in server.requests] == [2, 3, 4]
