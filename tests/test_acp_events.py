"""The ACP update mapping and permission answers, on messages recorded from the real agents.

tests/data/acp/*.jsonl are what ``gemini --acp`` 0.61.0, claude-code-acp 0.16.2 and
codex-acp 0.16.0 wrote on stdout in one run of tests/test_acp_runtime.py's MCP scenario
(a text, a call of the butler's ``state_set``, a text): the run's ``stdout.log``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spawnkit.events import AssistantText, RunEvent, TextDelta, ToolCallFinished, ToolCallStarted
from spawnkit.events import UsageUpdate as UsageEvent
from spawnkit.runtimes.acp.approval import butler_tools, chosen_option
from spawnkit.runtimes.acp.client import mcp_servers, resume_method
from spawnkit.runtimes.acp.events import AcpUpdates, prompt_usage, tool_input, tool_name
from spawnkit.runtimes.base import McpServerSpec

DATA = Path(__file__).parent / "data" / "acp"
AGENTS = ["gemini-cli", "claude-code-acp", "codex-acp"]


def messages(agent: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / f"{agent}.jsonl").read_text().splitlines()]


def replay(agent: str) -> tuple[AcpUpdates, list[RunEvent], dict[str, Any]]:
    """Feed a recorded run through the mapping as the client does; (updates, events, result)."""
    updates = AcpUpdates("s1", "health")
    events: list[RunEvent] = []
    result: dict[str, Any] = {}
    for message in messages(agent):
        method = message.get("method")
        if method == "session/update":
            events += updates.feed(message["params"]["update"])
        elif method == "session/request_permission":
            events += updates.asked(message["params"]["toolCall"])
        elif "stopReason" in (message.get("result") or {}):
            result = message["result"]
            events += updates.finish(result)
    return updates, events, result


@pytest.mark.parametrize("agent", AGENTS)
def test_recorded_run_maps_to_one_mcp_call_and_text(agent: str) -> None:
    updates, events, result = replay(agent)
    assert result["stopReason"] == "end_turn"
    started = [e.call for e in events if isinstance(e, ToolCallStarted)]
    finished = [e.call for e in events if isinstance(e, ToolCallFinished)]
    (call,) = started
    assert (call.server, call.tool) == ("health", "state_set")
    assert call.input == {"key": "weight", "value": "72.4 kg"} or agent == "claude-code-acp"
    (done,) = finished
    assert done.status == "ok" and "stored weight" in (done.output or "")
    assert updates.calls[done.id].input == {"key": "weight", "value": "72.4 kg"}
    # Text before the call and after it are two blocks; the answer is the last.
    texts = [e.text for e in events if isinstance(e, AssistantText)]
    assert texts[-1].startswith("Stored:") and any("Recording it." in t for t in texts[:-1])
    assert updates.answer().startswith("Stored:")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)).endswith(texts[-1])
    assert updates.unfinished() == []


def test_gemini_usage_comes_from_the_prompt_results_meta_quota() -> None:
    updates, events, _ = replay("gemini-cli")
    (usage,) = [e for e in events if isinstance(e, UsageEvent)]
    assert (usage.usage.input_tokens, usage.usage.output_tokens) == (230, 32)
    assert updates.usage == usage.usage


def test_acp_usage_and_cost() -> None:
    usage = prompt_usage(
        {"stopReason": "end_turn", "usage": {"totalTokens": 30, "inputTokens": 20,
                                             "outputTokens": 10, "cachedReadTokens": 5}}
    )  # fmt: skip
    assert usage is not None and (usage.input_tokens, usage.cache_read_tokens) == (15, 5)
    assert prompt_usage({"stopReason": "end_turn"}) is None
    updates = AcpUpdates("s1")
    (event,) = updates.feed(
        {"sessionUpdate": "usage_update", "used": 1, "size": 9,
         "cost": {"amount": 0.25, "currency": "USD"}}
    )  # fmt: skip
    assert isinstance(event, UsageEvent) and event.cost_usd == 0.25
    assert updates.feed({"sessionUpdate": "usage_update", "used": 142, "size": 258400}) == []


def test_tool_names_as_each_agent_titles_them() -> None:
    assert tool_name({"title": "state_set (health MCP Server)"}, "health") == (
        "mcp__health__state_set"
    )
    assert tool_name({"title": "Tool: health/state_set"}, "health") == "mcp__health__state_set"
    assert tool_name({"_meta": {"claudeCode": {"toolName": "Bash"}}, "title": "`ls`"}, "") == (
        "Bash"
    )
    assert tool_name({"title": "ls -la", "kind": "execute"}, "") == "shell"
    assert tool_input({"rawInput": {"server": "h", "tool": "t", "arguments": {"a": 1}}}) == {"a": 1}
    gemini_text = {"type": "content", "content": {"type": "text", "text": "not json"}}
    assert tool_input({"content": [gemini_text]}) == {}


def test_a_denied_call_fails_unless_the_agent_ended_it() -> None:
    updates = AcpUpdates("s1", "health")
    updates.asked({"toolCallId": "c1", "title": "Write file", "kind": "edit"})
    (event,) = updates.denied("c1", "not allowed")
    assert isinstance(event, ToolCallFinished) and event.call.status == "error"
    assert updates.denied("c1", "again") == []


def test_permission_answers_use_the_agents_own_options() -> None:
    for agent in AGENTS:
        (asked,) = [m for m in messages(agent) if m.get("method") == "session/request_permission"]
        options = asked["params"]["options"]
        yes = chosen_option(options, True)["outcome"]
        no = chosen_option(options, False)["outcome"]
        kinds = {o["optionId"]: o["kind"] for o in options}
        assert kinds[yes["optionId"]] == "allow_once"
        assert kinds[no["optionId"]] == "reject_once"
    assert chosen_option([{"optionId": "ok", "kind": "allow_once"}], False) == {
        "outcome": {"outcome": "cancelled"}
    }
    assert butler_tools("Write", "edit") == ("Write",)
    assert butler_tools("Write file", "edit") == ("Write", "Edit")
    assert butler_tools("mystery", None) == ()


def test_session_new_gets_the_mcp_server_with_its_secret_as_a_header() -> None:
    server = McpServerSpec("health", "http", "http://127.0.0.1:9/mcp", secret="s3cret")
    (entry,) = mcp_servers(server)
    assert entry == {
        "type": "http", "name": "health", "url": "http://127.0.0.1:9/mcp",
        "headers": [{"name": "Authorization", "value": "Bearer s3cret"}],
    }  # fmt: skip
    assert "s3cret" not in repr(server)
    assert mcp_servers(None) == []


@pytest.mark.parametrize(
    ("agent", "method"),
    [("gemini-cli", "session/load"), ("claude-code-acp", "session/resume"),
     ("codex-acp", "session/resume")],
)  # fmt: skip
def test_resume_uses_what_each_agent_advertises(agent: str, method: str) -> None:
    (init,) = [m for m in messages(agent) if "agentCapabilities" in (m.get("result") or {})]
    assert resume_method(init["result"]["agentCapabilities"]) == method
    assert resume_method({}) is None
