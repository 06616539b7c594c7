"""The Gemini wire adapter (as the Gemini CLI calls it), its recorder side, and the app.

Request bodies are trimmed copies of what gemini-cli 0.61.0 really sent
(``tests/fixtures/replay/gemini_*.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from spawnkit.replay import ReplayServer, Scenario
from spawnkit.replay.gemini import (
    GenerateAssembler,
    GenerateContentRequest,
    error_body,
    estimate_usage,
    last_tool_result,
    prompt_text,
    recorded_usage,
    response_body,
    response_chunks,
    response_text,
    scenario_tool_name,
    sse_frames,
    system_text,
    to_turn_request,
    tool_names,
    turn_from_generate,
    turn_index,
)
from spawnkit.replay.recorded import RecordedCall, turn_from_error
from spawnkit.replay.scenario import ErrorSpec, PlannedCall, Reply, ShellTool, TurnRequest, Usage
from spawnkit.replay.sse import SSEDecoder

FIXTURES = Path(__file__).parent / "fixtures" / "replay"


def fixture(name: str) -> GenerateContentRequest:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return cast(GenerateContentRequest, data["body"])


def parse_sse(text: str) -> list[dict[str, Any]]:
    """A deliberately naive reader of Gemini's ``data:``-only SSE."""
    chunks = []
    for block in text.split("\n\n"):
        if block:
            assert block.startswith("data: ") and "\n" not in block
            chunks.append(json.loads(block.removeprefix("data: ")))
    return chunks


# --- requests as the Gemini CLI sends them ---------------------------------------------------


def test_first_request_from_gemini() -> None:
    body = fixture("gemini_mcp_first")
    assert turn_index(body) == 0
    # The first part is the CLI's <session_context> block; the prompt is the rest.
    assert cast(list[Any], body["contents"])[0]["parts"][0]["text"].startswith("<session_context>")
    assert prompt_text(body) == "What is my weight?"
    names = tool_names(body)
    assert "mcp__health__state_get" in names and "mcp_health_state_get" not in names
    assert "read_file" in names
    assert "run_shell_command" not in names  # headless: only with --allowed-tools or yolo
    assert to_turn_request(body).shell is None
    assert last_tool_result(body) == ""
    assert system_text(body).startswith("You are a non-interactive CLI agent")


def test_second_request_carries_the_mcp_result() -> None:
    body = fixture("gemini_mcp_second")
    assert turn_index(body) == 1
    assert prompt_text(body) == "What is my weight?"
    # Raw: {"output": "<untrusted_context>\n81.5 kg\n</untrusted_context>"}
    assert last_tool_result(body) == "81.5 kg"


def test_parallel_calls_are_one_model_content() -> None:
    body = fixture("gemini_parallel_second")
    assert [content["role"] for content in body["contents"]] == ["user", "model", "user"]
    assert turn_index(body) == 1
    assert last_tool_result(body) == "81.5 kg\nhi"


def test_shell_result_keeps_only_the_output_section() -> None:
    body = fixture("gemini_shell_second")
    request = to_turn_request(body)
    assert request.shell == ShellTool("run_shell_command", "command")
    # Raw: "Output: hi\nExit Code: 3\nProcess Group PGID: 26704" (the PGID varies per run).
    assert request.last_tool_result == "hi"


@pytest.mark.parametrize(
    ("name", "response", "text"),
    [
        ("run_shell_command", {"output": "Output: a\nb\nError: x\nSignal: 9"}, "a\nb"),
        ("mcp_h_t", {"error": "Tool not found"}, "Tool not found"),
        ("mcp_h_t", {"content": [1]}, '{"content": [1]}'),
        ("read_file", {"output": "<untrusted_context>\n</x>\n</untrusted_context>"}, "</x>"),
    ],
)
def test_response_text(name: str, response: Any, text: str) -> None:
    assert response_text(name, response) == text


@pytest.mark.parametrize(
    ("wire", "seen"),
    [
        ("mcp_health_state_get", "mcp__health__state_get"),
        ("mcp_health_get", "mcp__health__get"),
        ("mcp_my_server_get", "mcp__my__server_get"),  # underscores in server names: ambiguous
        ("mcp_health-log_get", "mcp__health-log__get"),
        ("mcp_", "mcp_"),
        ("run_shell_command", "run_shell_command"),
    ],
)
def test_mcp_tool_names_are_presented_like_claude_codes(wire: str, seen: str) -> None:
    assert scenario_tool_name(wire) == seen


def test_same_glob_resolves_and_goes_back_as_the_wire_name() -> None:
    body = fixture("gemini_mcp_first")
    scenario = Scenario.from_dict({"turn": [{"tool": "mcp__*__state_get", "input": {"key": "w"}}]})
    request = to_turn_request(body)
    reply = scenario.reply(request)
    assert reply.tool_calls == (PlannedCall("mcp__health__state_get", {"key": "w"}),)
    chunks = response_chunks(body, request, reply, model="m", usage=estimate_usage(body, reply))
    assert chunks[-1]["candidates"][0]["content"]["parts"] == [
        {"functionCall": {"name": "mcp_health_state_get", "args": {"key": "w"}}}
    ]


# --- rendering -------------------------------------------------------------------------------


def test_sse_frames_for_text_and_calls_parse_back() -> None:
    body = fixture("gemini_parallel_second")
    request = TurnRequest("p", 1)
    reply = Reply(
        text="Checking now",
        tool_calls=(
            PlannedCall("mcp__health__state_get", {"key": "weight"}),
            PlannedCall("run_shell_command", {"command": "echo hi"}),
        ),
        chunk_chars=5,
    )
    usage = estimate_usage(body, reply)
    frames = sse_frames(body, request, reply, model="gemini-x", usage=usage)
    chunks = parse_sse("".join(frames))
    assert len(chunks) == 3 + 1  # three text pieces, then the calls together
    texts = [c["candidates"][0]["content"]["parts"][0].get("text") for c in chunks[:3]]
    assert "".join(cast(list[str], texts)) == "Checking now"
    assert [c["candidates"][0].get("finishReason") for c in chunks] == [None, None, None, "STOP"]
    assert ["usageMetadata" in c for c in chunks] == [False, False, False, True]
    assert chunks[-1]["usageMetadata"] == usage
    assert {c["modelVersion"] for c in chunks} == {"gemini-x"}
    assert chunks[-1]["candidates"][0]["content"] == {
        "role": "model",
        "parts": [
            {"functionCall": {"name": "mcp_health_state_get", "args": {"key": "weight"}}},
            {"functionCall": {"name": "run_shell_command", "args": {"command": "echo hi"}}},
        ],
    }

    decoder, assembler = SSEDecoder(), GenerateAssembler()
    raw = "".join(frames).encode()
    for offset in range(0, len(raw), 9):
        for event in decoder.feed(raw[offset : offset + 9]):
            assembler.feed(event)
    assert assembler.complete
    turn = assembler.turn()
    assert turn.text == "Checking now"
    assert turn.tool_calls == (
        RecordedCall("mcp__health__state_get", {"key": "weight"}),
        RecordedCall("run_shell_command", {"command": "echo hi"}),
    )
    assert turn_from_generate(chunks) == turn  # the non-SSE stream: one JSON array


def test_text_only_and_non_streamed_body() -> None:
    body = fixture("gemini_mcp_first")
    request = to_turn_request(body)
    reply = Reply(text="Hello there", chunk_chars=4)
    usage = estimate_usage(body, reply)
    plain = response_body(body, request, reply, model="m", usage=usage)
    assert plain["candidates"][0]["content"]["parts"] == [{"text": "Hello there"}]
    assert plain["candidates"][0]["finishReason"] == "STOP"
    assert turn_from_generate(plain).text == "Hello there"
    empty = response_chunks(body, request, Reply(), model="m", usage=usage)
    assert [c["candidates"][0]["content"]["parts"] for c in empty] == [[{"text": ""}]]


def test_usage_maps_cached_tokens_into_the_prompt_and_back() -> None:
    body = fixture("gemini_mcp_first")
    given = Usage(
        input_tokens=100,
        output_tokens=20,
        cache_read_input_tokens=50,
        cache_creation_input_tokens=10,
    )
    usage = estimate_usage(body, Reply(text="x", usage=given))
    assert usage == {
        "promptTokenCount": 160,  # includes the cached tokens (and, here, cache writes)
        "candidatesTokenCount": 20,
        "totalTokenCount": 180,
        "cachedContentTokenCount": 50,
    }
    # Gemini has no cache-write count: it stays in the prompt, so replays total the same.
    assert recorded_usage(usage) == {
        "input_tokens": 110,
        "output_tokens": 20,
        "cache_read_input_tokens": 50,
    }
    assert recorded_usage({"candidatesTokenCount": 3, "thoughtsTokenCount": 4}) == {
        "output_tokens": 7,
        "cache_read_input_tokens": 0,
    }
    estimated = estimate_usage(body, Reply(text="x" * 40))
    assert estimated["candidatesTokenCount"] == 10
    assert estimated["cachedContentTokenCount"] == 0
    assert estimate_usage(body, Reply(text="x" * 40)) == estimated


def test_error_bodies_both_ways() -> None:
    assert error_body(ErrorSpec(429, "RESOURCE_EXHAUSTED", "Quota")) == {
        "error": {"code": 429, "message": "Quota", "status": "RESOURCE_EXHAUSTED"}
    }
    assert error_body(ErrorSpec(529, "overloaded_error", "Busy"))["error"]["status"] == "INTERNAL"
    assert error_body(ErrorSpec(503, "api_error", "Down"))["error"]["status"] == "UNAVAILABLE"
    recorded = turn_from_error(503, {"error": {"code": 503, "message": "Down", "status": "X"}})
    assert recorded.error == ErrorSpec(503, "X", "Down")
    assembler = GenerateAssembler()
    assembler.feed_chunk({"error": {"code": 500, "message": "boom", "status": "INTERNAL"}})
    assert assembler.error == ErrorSpec(500, "INTERNAL", "boom")
    assert not assembler.complete


# --- the app in process ----------------------------------------------------------------------


async def test_app_serves_gemini_methods() -> None:
    scenario = Scenario.from_dict(
        {
            "script": [
                {"match": "^fail", "turn": [{"error": {"status": 429, "message": "Quota"}}]},
                {"turn": [{"text": "hi {{ prompt }}", "usage": {"output_tokens": 2}}]},
            ]
        }
    )
    server = ReplayServer(scenario)
    request = {"contents": [{"role": "user", "parts": [{"text": "yo"}]}]}
    base = "/v1beta/models/gemini-2.5-flash"
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replay") as client:
        streamed = await client.post(f"{base}:streamGenerateContent?alt=sse", json=request)
        assert streamed.headers["content-type"].startswith("text/event-stream")
        chunks = parse_sse(streamed.text)
        assert chunks[-1]["candidates"][0]["content"]["parts"] == [{"text": "hi yo"}]
        assert chunks[-1]["modelVersion"] == "gemini-2.5-flash"
        assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == 2

        array = await client.post(f"{base}:streamGenerateContent", json=request)
        assert array.json()[-1]["candidates"][0]["content"]["parts"] == [{"text": "hi yo"}]

        plain = await client.post(f"{base}:generateContent", json=request)
        assert plain.json()["candidates"][0]["content"]["parts"] == [{"text": "hi yo"}]

        counted = await client.post(f"{base}:countTokens", json=request)
        assert counted.json()["totalTokens"] >= 1

        failed = await client.post(
            f"{base}:streamGenerateContent?alt=sse",
            json={"contents": [{"role": "user", "parts": [{"text": "fail"}]}]},
        )
        assert failed.status_code == 429
        assert failed.json() == {
            "error": {"code": 429, "message": "Quota", "status": "RESOURCE_EXHAUSTED"}
        }
        unknown = await client.post(f"{base}:embedContent", json=request)
        assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
        assert (await client.post(f"{base}:generateContent", content=b"x")).status_code == 400

    logged = server.requests
    assert logged[0].path == f"{base}:streamGenerateContent"
    assert logged[0].query == "alt=sse"
    assert logged[0].body == request
    assert len(logged) == 7


def test_recorder_records_streamed_plain_and_error_responses(tmp_path: Path) -> None:
    out = tmp_path / "rec.toml"
    body = fixture("gemini_mcp_first")
    base = "/v1beta/models/gemini-2.5-flash"
    upstream = ReplayServer(
        Scenario.from_dict(
            {
                "script": [
                    {"match": "^plain", "turn": [{"text": "plain {{ prompt }}"}]},
                    {"match": "^fail", "turn": [{"error": {"status": 503, "message": "Down"}}]},
                    {"turn": [{"tool": "mcp__*__state_get", "input": {"key": "w"}}]},
                ]
            }
        )
    )

    def user(text: str) -> dict[str, Any]:
        return {"contents": [{"role": "user", "parts": [{"text": text}]}]}

    with upstream.serve_in_thread() as upstream_url:
        recorder = ReplayServer.recorder(upstream_url, out)
        with recorder.serve_in_thread() as url, httpx.Client(base_url=url) as client:
            streamed = client.post(f"{base}:streamGenerateContent?alt=sse", json=body)
            plain = client.post(f"{base}:generateContent", json=user("plain one"))
            failed = client.post(f"{base}:streamGenerateContent?alt=sse", json=user("fail"))
            client.post(f"{base}:countTokens", json=user("not a turn"))
    assert (streamed.status_code, plain.status_code, failed.status_code) == (200, 200, 503)
    recorded = Scenario.load(out)
    assert len(recorded.scripts) == 3
    first = recorded.reply(to_turn_request(body))
    assert first.tool_calls == (PlannedCall("mcp__health__state_get", {"key": "w"}),)
    assert recorded.reply(TurnRequest("plain one", 0)).text == "plain plain one"
    assert recorded.reply(TurnRequest("fail", 0)).error == ErrorSpec(503, "UNAVAILABLE", "Down")
