"""The OpenAI Responses wire adapter (as Codex calls it), its recorder side, and the app.

Request bodies are trimmed copies of what codex-cli 0.169.0 really sent
(``tests/fixtures/replay/codex_*.json``). The portable ``shell`` turn is tested here for
all three adapters.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from spawnkit.errors import ScenarioError
from spawnkit.replay import ReplayServer, Scenario, anthropic, gemini
from spawnkit.replay.openai import (
    ResponseAssembler,
    ResponsesRequest,
    error_body,
    estimate_usage,
    last_tool_result,
    output_text,
    prompt_text,
    recorded_usage,
    response_body,
    shell_tool,
    sse_frames,
    system_text,
    to_turn_request,
    tool_names,
    turn_from_response,
    turn_index,
)
from spawnkit.replay.recorded import RecordedCall, RecordedTurn
from spawnkit.replay.recorder import Recording
from spawnkit.replay.scenario import (
    ErrorSpec,
    PlannedCall,
    Reply,
    ShellTool,
    TurnRequest,
    Usage,
)
from spawnkit.replay.sse import SSEDecoder

FIXTURES = Path(__file__).parent / "fixtures" / "replay"


def fixture(name: str) -> ResponsesRequest:
    return cast(ResponsesRequest, json.loads((FIXTURES / f"{name}.json").read_text())["body"])


def parse_sse(frames: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """A deliberately naive SSE reader, independent of the recorder's decoder."""
    events = []
    for block in "".join(frames).split("\n\n"):
        if block:
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            events.append((lines["event"], json.loads(lines["data"])))
    return events


# --- requests as Codex sends them ------------------------------------------------------


def test_first_request_from_codex() -> None:
    body = fixture("codex_mcp_first")
    assert turn_index(body) == 0
    # The <environment_context> user message and the developer messages are not the prompt.
    assert prompt_text(body) == "What is my weight?"
    names = tool_names(body)
    assert "mcp__health__state_get" in names  # namespace mcp__health, tool state_get
    assert "exec_command" in names
    assert "multi_agent_v1__close_agent" in names  # any namespace: NS__TOOL
    assert shell_tool(body) == ShellTool("exec_command", "cmd")
    assert last_tool_result(body) == ""
    assert "You are a coding agent running in the Codex CLI" in system_text(body)


def test_second_request_carries_the_mcp_result() -> None:
    body = fixture("codex_mcp_second")
    assert turn_index(body) == 1
    assert prompt_text(body) == "What is my weight?"
    # Raw output: "Wall time: 0.0042 seconds\nOutput:\n{...}"; the header is dropped.
    assert last_tool_result(body) == '{"result":"81.5 kg"}'
    request = to_turn_request(body)
    assert (request.turn_index, request.last_tool_result) == (1, '{"result":"81.5 kg"}')


def test_text_and_parallel_calls_count_as_one_turn() -> None:
    body = fixture("codex_parallel_second")
    kinds = [item.get("type") for item in cast(list[dict[str, Any]], body["input"])][-5:]
    assert kinds == [
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    assert turn_index(body) == 1
    assert last_tool_result(body) == '{"result":"81.5 kg"}\nhi'


def test_agents_md_and_developer_instructions_are_not_the_prompt() -> None:
    body = fixture("codex_agents_md")
    assert prompt_text(body) == "Line one\nline two"
    assert "Dev instr here" in system_text(body)


def test_plain_string_input_and_instructions() -> None:
    body = cast(ResponsesRequest, {"input": "hello", "instructions": "Be brief."})
    assert to_turn_request(body) == TurnRequest("hello", 0, system="Be brief.")


@pytest.mark.parametrize(
    ("output", "text"),
    [
        (
            "Chunk ID: 1a\nWall time: 0.0000 seconds\nProcess exited with code 0\n"
            "Original token count: 1\nOutput:\nhi\n",
            "hi",
        ),
        ('Wall time: 0.0042 seconds\nOutput:\n{"result":"81.5 kg"}', '{"result":"81.5 kg"}'),
        ("no header here\n", "no header here\n"),
        ([{"type": "input_text", "text": "a"}, {"type": "input_image"}], "a"),
    ],
)
def test_output_text_drops_the_codex_header(output: Any, text: str) -> None:
    assert output_text(output) == text


# --- rendering -----------------------------------------------------------------------------


def test_sse_frames_for_text_and_calls_parse_back() -> None:
    body = fixture("codex_mcp_first")
    request = to_turn_request(body)
    reply = Reply(
        text="Checking now",
        tool_calls=(
            PlannedCall("mcp__health__state_get", {"key": "weight"}),
            PlannedCall("exec_command", {"cmd": "echo hi"}),
        ),
        chunk_chars=5,
    )
    usage = estimate_usage(body, reply)
    frames = sse_frames(body, request, reply, model="m", usage=usage)
    events = parse_sse(frames)
    names = [name for name, _ in events]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert names.count("response.output_item.added") == names.count("response.output_item.done")
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert text == "Checking now"
    assert names.count("response.output_text.delta") == 3

    done = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert [item["type"] for item in done] == ["message", "function_call", "function_call"]
    assert (done[1]["namespace"], done[1]["name"]) == ("mcp__health", "state_get")
    assert "namespace" not in done[2]
    assert json.loads(done[2]["arguments"]) == {"cmd": "echo hi"}
    assert done[1]["call_id"] != done[2]["call_id"]
    completed = events[-1][1]["response"]
    assert completed["status"] == "completed"
    assert completed["output"] == done
    assert completed["usage"] == usage
    assert completed["model"] == "m"

    decoder, assembler = SSEDecoder(), ResponseAssembler()
    raw = "".join(frames).encode()
    for offset in range(0, len(raw), 11):
        for event in decoder.feed(raw[offset : offset + 11]):
            assembler.feed(event)
    assert assembler.complete
    turn = assembler.turn()
    assert turn.text == "Checking now"
    assert turn.tool_calls == (
        RecordedCall("mcp__health__state_get", {"key": "weight"}),
        RecordedCall("exec_command", {"cmd": "echo hi"}),
    )
    assert sse_frames(body, request, reply, model="m", usage=usage) == frames  # deterministic


def test_text_only_reply_and_non_streamed_body() -> None:
    body = fixture("codex_mcp_first")
    request = to_turn_request(body)
    reply = Reply(text="Hello")
    usage = estimate_usage(body, reply)
    events = parse_sse(sse_frames(body, request, reply, model="m", usage=usage))
    done = [d["item"] for n, d in events if n == "response.output_item.done"]
    assert done == [
        {
            "type": "message",
            "id": done[0]["id"],
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello", "annotations": []}],
        }
    ]
    plain = response_body(body, request, reply, model="m", usage=usage)
    assert plain["output"] == done
    assert turn_from_response(plain).text == "Hello"


def test_custom_tool_calls_carry_their_input_string() -> None:
    body = cast(
        ResponsesRequest, {"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}
    )
    request = to_turn_request(body)
    reply = Reply(tool_calls=(PlannedCall("apply_patch", {"input": "*** Begin Patch"}),))
    usage = estimate_usage(body, reply)
    events = parse_sse(sse_frames(body, request, reply, model="m", usage=usage))
    item = next(d["item"] for n, d in events if n == "response.output_item.done")
    assert (item["type"], item["input"]) == ("custom_tool_call", "*** Begin Patch")


def test_usage_maps_cached_tokens_into_input_and_back() -> None:
    body = fixture("codex_mcp_first")
    given = Usage(
        input_tokens=100,
        output_tokens=20,
        cache_read_input_tokens=50,
        cache_creation_input_tokens=10,
    )
    usage = estimate_usage(body, Reply(text="x", usage=given))
    assert usage == {
        "input_tokens": 160,  # OpenAI's input_tokens include the cached part
        "input_tokens_details": {"cached_tokens": 50, "cache_write_tokens": 10},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 180,
    }
    assert recorded_usage(usage) == {
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_read_input_tokens": 50,
        "cache_creation_input_tokens": 10,
    }
    # A real OpenAI upstream sends no cache_write_tokens.
    assert recorded_usage({"input_tokens": 90, "input_tokens_details": {"cached_tokens": 40}}) == {
        "input_tokens": 50,
        "cache_read_input_tokens": 40,
    }
    estimated = estimate_usage(body, Reply(text="x" * 40))
    assert estimated["output_tokens"] == 10
    assert estimated["input_tokens"] > 100
    assert estimated["input_tokens_details"]["cached_tokens"] == 0
    assert estimate_usage(body, Reply(text="x" * 40)) == estimated


def test_error_body_and_stream_failures() -> None:
    assert error_body(ErrorSpec(529, "overloaded_error", "Overloaded")) == {
        "error": {
            "message": "Overloaded",
            "type": "overloaded_error",
            "param": None,
            "code": "overloaded_error",
        }
    }
    decoder, assembler = SSEDecoder(), ResponseAssembler()
    failed = {"type": "response.failed", "response": {"error": {"code": "x", "message": "boom"}}}
    for event in decoder.feed(f"event: response.failed\ndata: {json.dumps(failed)}\n\n".encode()):
        assembler.feed(event)
    assert assembler.error == ErrorSpec(500, "x", "boom")
    assert not assembler.complete


# --- the portable shell turn, on all three adapters ------------------------------------------

SHELL_SCENARIO = {
    "script": [
        {
            "match": "list (\\w+)",
            "turn": [{"shell": "ls {{ match.1 }}"}, {"text": "{{ last_tool_result }}"}],
        }
    ]
}


def test_shell_turn_uses_each_runtimes_shell_tool() -> None:
    scenario = Scenario.from_dict(SHELL_SCENARIO)
    codex = to_turn_request(fixture("codex_mcp_first"))
    assert scenario.reply(
        TurnRequest("list docs", 0, codex.tools, shell=codex.shell)
    ).tool_calls == (PlannedCall("exec_command", {"cmd": "ls docs"}),)
    claude = anthropic.to_turn_request(
        cast(
            anthropic.MessagesRequest,
            {
                "messages": [{"role": "user", "content": "list docs"}],
                "tools": [{"name": "Bash"}, {"name": "Read"}],
            },
        )
    )
    assert scenario.reply(claude).tool_calls == (PlannedCall("Bash", {"command": "ls docs"}),)
    gemini_request = gemini.to_turn_request(
        cast(
            gemini.GenerateContentRequest,
            {
                "contents": [{"role": "user", "parts": [{"text": "list docs"}]}],
                "tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}],
            },
        )
    )
    assert scenario.reply(gemini_request).tool_calls == (
        PlannedCall("run_shell_command", {"command": "ls docs"}),
    )
    argv = TurnRequest("list docs", 0, ("shell",), shell=ShellTool("shell", argv=True))
    assert scenario.reply(argv).tool_calls == (
        PlannedCall("shell", {"command": ["bash", "-lc", "ls docs"]}),
    )


def test_shell_turn_without_a_shell_tool_explains() -> None:
    reply = Scenario.from_dict(SHELL_SCENARIO).reply(TurnRequest("list docs", 0, ("Read",)))
    assert reply.tool_calls == ()
    assert "needs a shell tool" in reply.text and "Read" in reply.text


def test_shell_in_tool_calls_tables_mixes_with_tools() -> None:
    scenario = Scenario.from_dict(
        {"turn": [{"tool_calls": [{"shell": "date"}, {"tool": "mcp__*__get", "input": {"k": 1}}]}]}
    )
    request = TurnRequest("p", 0, ("Bash", "mcp__h__get"), shell=ShellTool("Bash"))
    assert scenario.reply(request).tool_calls == (
        PlannedCall("Bash", {"command": "date"}),
        PlannedCall("mcp__h__get", {"k": 1}),
    )


@pytest.mark.parametrize(
    ("turn", "where"),
    [
        ({"shell": "ls", "tool": "Bash"}, "turn[0].shell: use either tool or shell"),
        ({"shell": "ls", "input": {}}, "turn[0].input: input needs tool"),
        ({"shell": 3}, "turn[0].shell: expected a string"),
        ({"shell": "  "}, "turn[0].shell: empty shell command"),
        ({"shell": "{{ nope }}"}, "turn[0].shell: unknown placeholder"),
        ({"tool_calls": [{"shell": "ls", "input": {}}]}, "tool_calls[0].input: a shell call"),
    ],
)
def test_shell_validation(turn: dict[str, Any], where: str) -> None:
    with pytest.raises(ScenarioError, match=where.replace("[", r"\[").replace("]", r"\]")):
        Scenario.from_dict({"turn": [turn]})


def test_recorder_writes_plain_shell_calls_as_shell(tmp_path: Path) -> None:
    out = tmp_path / "out.toml"
    recording = Recording(out, "http://upstream")
    codex = to_turn_request(fixture("codex_mcp_first"))
    recording.add_turn(
        codex,
        "s1",
        RecordedTurn(
            tool_calls=(
                RecordedCall("exec_command", {"cmd": "echo {{hi}}"}),
                RecordedCall("exec_command", {"cmd": "ls", "workdir": "/"}),
                RecordedCall("mcp__health__state_get", {"key": "weight"}),
            ),
            usage={"input_tokens": 3},
        ),
    )
    claude_body = {"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "Bash"}]}
    recording.add(
        cast(anthropic.MessagesRequest, claude_body),
        "s2",
        RecordedTurn(tool_calls=(RecordedCall("Bash", {"command": "pwd"}),)),
    )
    scenario = Scenario.load(out)
    first, second = (script.turns[0] for script in scenario.scripts)
    replayed = scenario.reply(codex)
    assert replayed.tool_calls == (
        PlannedCall("exec_command", {"cmd": "echo {{hi}}"}),
        PlannedCall("exec_command", {"cmd": "ls", "workdir": "/"}),
        PlannedCall("mcp__health__state_get", {"key": "weight"}),
    )
    assert 'shell = "echo \\\\{{hi}}"' in out.read_text()
    assert 'shell = "pwd"' in out.read_text()
    assert len(first.tool_calls) == 3 and len(second.tool_calls) == 1


# --- the app in process ----------------------------------------------------------------------


async def test_app_serves_responses_streamed_plain_and_errors() -> None:
    scenario = Scenario.from_dict(
        {
            "script": [
                {
                    "match": "^fail",
                    "turn": [
                        {
                            "error": {
                                "status": 429,
                                "type": "rate_limit_error",
                                "message": "Slow down",
                            }
                        }
                    ],
                },
                {
                    "turn": [
                        {"text": "hi {{ prompt }}", "usage": {"input_tokens": 5}, "delay_ms": 150}
                    ]
                },
            ]
        }
    )
    server = ReplayServer(scenario)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replay") as client:
        started = time.monotonic()
        streamed = await client.post(
            "/v1/responses",
            json={"model": "asked", "stream": True, "input": "yo"},
            headers={"session-id": "abc"},
        )
        assert time.monotonic() - started >= 0.15
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = parse_sse([streamed.text])
        assert events[-1][1]["response"]["model"] == "asked"
        assert events[-1][1]["response"]["usage"]["input_tokens"] == 5
        deltas = [d["delta"] for n, d in events if n == "response.output_text.delta"]
        assert deltas == ["hi yo"]

        plain = await client.post("/responses", json={"input": "yo"})  # base_url without /v1
        assert plain.json()["output"][0]["content"][0]["text"] == "hi yo"

        failed = await client.post("/v1/responses", json={"stream": True, "input": "fail"})
        assert failed.status_code == 429
        assert failed.json()["error"]["message"] == "Slow down"
        assert (await client.post("/v1/responses", content=b"nope")).status_code == 400

    logged = server.requests
    assert [entry.path for entry in logged] == [
        "/v1/responses",
        "/responses",
        "/v1/responses",
        "/v1/responses",
    ]
    assert logged[0].headers["session-id"] == "abc"
    assert logged[0].body["model"] == "asked"


def test_recorder_records_streamed_and_plain_responses(tmp_path: Path) -> None:
    out = tmp_path / "rec.toml"
    body = dict(fixture("codex_mcp_first"))
    upstream = ReplayServer(
        Scenario.from_dict(
            {
                "script": [
                    {"match": "^plain", "turn": [{"text": "plain {{ prompt }}"}]},
                    {
                        "turn": [
                            {
                                "tool": "mcp__*__state_get",
                                "input": {"key": "w"},
                                "usage": {"input_tokens": 7, "cache_read_input_tokens": 3},
                            }
                        ]
                    },
                ]
            }
        )
    )
    with upstream.serve_in_thread() as upstream_url:
        recorder = ReplayServer.recorder(upstream_url, out)
        with recorder.serve_in_thread() as url, httpx.Client(base_url=url) as client:
            streamed = client.post("/v1/responses", json=body, headers={"session-id": "t1"})
            plain = client.post("/v1/responses", json={"input": "plain one"})
    assert streamed.status_code == 200 and plain.status_code == 200
    recorded = Scenario.load(out)
    first = recorded.reply(to_turn_request(cast(ResponsesRequest, body)))
    assert first.tool_calls == (PlannedCall("mcp__health__state_get", {"key": "w"}),)
    # Recorded in the scenario's terms: OpenAI's input_tokens (10) minus the cached part.
    usage = first.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (7, 3)
    assert usage.cache_creation_input_tokens == 0
    assert recorded.reply(TurnRequest("plain one", 0)).text == "plain plain one"
