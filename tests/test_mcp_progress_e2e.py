"""End to end: an MCP caller of ``trigger`` sees the run's progress live, then its result.

A real MCP client (the ``mcp`` package's streamable HTTP client) calls the ``trigger``
tool of a real butler server with a progress callback; the triggered run is the real
Claude Code CLI against the replay model server, and it calls the same butler's MCP
server itself. The notifications must all arrive before the result, numbered in order,
and say what the run did in the order it did it: the tool call starting, the same call
finishing, the text chunks, the usage.
"""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest

from spawnkit.replay import Scenario
from spawnkit.serve.service import ButlerService

from . import mcp_clients

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SCENARIO = Scenario.from_dict(
    tomllib.loads(
        "[[turn]]\n"
        'text = "Storing it."\n'
        'tool = "mcp__*__state_set"\n'
        'input = { key = "weight", value = "72.4 kg" }\n'
        "usage = { input_tokens = 100, output_tokens = 20 }\n"
        "[[turn]]\n"
        'text = "Stored: {{ last_tool_result }}"\n'
        "usage = { input_tokens = 130, output_tokens = 12 }\n"
    ),
    source="<test>",
)


async def test_trigger_reports_progress_before_its_result(make_butler, store) -> None:
    seen: list[tuple[str, Any]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(("progress", (progress, json.loads(message or "null"))))

    async with ButlerService(make_butler(), store=store, replay=SCENARIO) as svc:
        secret = await svc.access.grant("an-outside-caller")
        url = f"{svc.mcp_url}/mcp?session_id=an-outside-caller"
        async with mcp_clients.http_client(url, secret) as client:
            result = await client.call_tool(
                "trigger", {"prompt": "log my weight"}, progress_callback=on_progress
            )
            seen.append(("result", result.structured_content))

    kinds = [kind for kind, _ in seen]
    assert kinds[-1] == "result" and kinds.count("result") == 1
    final = seen[-1][1]
    assert final["success"] is True, final["error"]
    numbers = [number for kind, (number, _) in seen[:-1] if kind == "progress"]  # type: ignore[misc]
    assert numbers == list(range(1, len(numbers) + 1))
    messages = [message for _, (_, message) in seen[:-1]]  # type: ignore[misc]

    calls = [(m["tool"], m["status"], m["input"]) for m in messages if m["event"] == "tool_call"]
    assert calls == [
        ("state_set", "running", {"key": "weight", "value": "72.4 kg"}),
        ("state_set", "ok", {"key": "weight", "value": "72.4 kg"}),
    ]
    (call,) = final["tool_calls"]
    assert {m["id"] for m in messages if m["event"] == "tool_call"} == {call["id"]}

    texts = [m["text"] for m in messages if m["event"] == "text"]
    assert texts[0] == "Storing it."
    assert texts[-1].startswith("Stored:") and texts[-1] in final["output"]
    # In the order the run did it: text, then the call, then the text that used its result.
    order = [m["event"] for m in messages if m["event"] != "usage"]
    assert order == ["text", "tool_call", "tool_call", "text"]

    usages = [m for m in messages if m["event"] == "usage"]
    assert usages, "no usage update reached the caller"
    assert usages[-1]["output_tokens"] == final["usage"]["output_tokens"]
    assert store.state_get("health", "weight") == "72.4 kg"
