"""The real Claude Code CLI against the replay server: MCP calls, record/replay, errors.

Each test runs the CLI bundled in claude-agent-sdk as a subprocess with a fresh HOME,
bounded by a timeout, against a replay server (and a real MCP server) on local threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import claude_agent_sdk
import pytest
from mcp.server.mcpserver import Context, MCPServer

from spawnkit._asgi import serve_in_thread
from spawnkit.replay import ReplayServer, Scenario

CLAUDE = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
CLI_TIMEOUT_S = 60

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not CLAUDE.exists(), reason="the bundled claude CLI is missing"),
]

WEIGHT_SCENARIO = """
description = "Health butler reads the stored weight"

[[script]]
match = "(?i)what is my (\\\\w+)"
  [[script.turn]]
  text = "Let me look that up."
  tool = "mcp__*__state_get"
  input = { key = "{{ match.1 }}" }
    [script.turn.usage]
    input_tokens = 100
    output_tokens = 20
    cache_read_input_tokens = 50
    cache_creation_input_tokens = 10
  [[script.turn]]
  text = "Your {{ match.1 }} is {{ last_tool_result }}."
  usage = { input_tokens = 130, output_tokens = 12, cache_read_input_tokens = 70 }
"""


@dataclass
class HealthState:
    values: dict[str, str] = field(default_factory=lambda: {"weight": "81.5 kg"})
    calls: list[str] = field(default_factory=list)


@pytest.fixture
def health() -> Iterator[tuple[str, HealthState]]:
    """A real MCP server named "health" with one tool; yields its URL and call log."""
    state = HealthState()
    server = MCPServer("health", log_level="WARNING")

    @server.tool()
    async def state_get(key: str, ctx: Context) -> str:
        """Read a stored value."""
        state.calls.append(key)
        return state.values.get(key, "unknown")

    app: Any = server.streamable_http_app()  # Starlette; uvicorn types ASGI apps stricter
    with serve_in_thread(app) as address:
        yield f"{address.url}/mcp", state


@dataclass(frozen=True)
class CliRun:
    events: list[dict[str, Any]]
    seconds: float

    @property
    def result(self) -> dict[str, Any]:
        return next(event for event in self.events if event.get("type") == "result")

    @property
    def tool_calls(self) -> list[tuple[str, dict[str, Any]]]:
        return [
            (block["name"], block["input"])
            for event in self.events
            if event.get("type") == "assistant"
            for block in event["message"]["content"]
            if block.get("type") == "tool_use"
        ]


def run_claude(base_url: str, home: Path, prompt: str, mcp_url: str | None = None) -> CliRun:
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "replay",
        "ENABLE_TOOL_SEARCH": "false",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    command = [
        str(CLAUDE),
        "-p",
        prompt,
        "--output-format",
        "stream-json",
        "--verbose",
        "--setting-sources",
        "",
    ]
    if mcp_url is not None:
        config = home / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"health": {"type": "http", "url": mcp_url}}}))
        command += [
            "--mcp-config",
            str(config),
            "--strict-mcp-config",
            "--allowedTools",
            "mcp__health__state_get",
        ]
    started = time.monotonic()
    completed = subprocess.run(
        command,
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    seconds = time.monotonic() - started
    events = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    assert any(e.get("type") == "result" for e in events), (
        f"no result line (exit {completed.returncode}): {completed.stderr[-2000:]}"
    )
    return CliRun(events, seconds)


def test_mcp_tool_call_and_usage(tmp_path: Path, health: tuple[str, HealthState]) -> None:
    mcp_url, state = health
    server = ReplayServer(Scenario.from_dict(tomllib.loads(WEIGHT_SCENARIO), source="weight.toml"))
    with server.serve_in_thread() as url:
        run = run_claude(url, tmp_path / "home", "What is my weight?", mcp_url)

    assert state.calls == ["weight"]  # the real MCP tool ran
    result = run.result
    assert result["is_error"] is False
    # mcp 2.x also returns a str result as structuredContent {"result": ...}, and the CLI
    # hands the model that JSON rather than the text block, so only check containment.
    assert result["result"].startswith("Your weight is ")
    assert "81.5 kg" in result["result"]
    assert run.tool_calls == [("mcp__health__state_get", {"key": "weight"})]
    # The CLI sums the two turns' usage, cache tokens included.
    usage = result["usage"]
    assert usage["cache_read_input_tokens"] == 120
    assert usage["cache_creation_input_tokens"] == 10
    assert usage["input_tokens"] == 230
    assert usage["output_tokens"] == 32

    model_calls = [r for r in server.requests if r.path == "/v1/messages"]
    assert len(model_calls) == 2
    assert "mcp__health__state_get" in [tool["name"] for tool in model_calls[0].body["tools"]]
    assert model_calls[0].headers["x-claude-code-session-id"] == result["session_id"]
    tool_results = [
        block
        for block in model_calls[1].body["messages"][-1]["content"]
        if block["type"] == "tool_result"
    ]
    assert "81.5 kg" in json.dumps(tool_results)


def test_record_then_replay(tmp_path: Path, health: tuple[str, HealthState]) -> None:
    mcp_url, state = health
    original = ReplayServer(Scenario.from_dict(tomllib.loads(WEIGHT_SCENARIO)))
    out = tmp_path / "recorded.toml"
    with original.serve_in_thread() as upstream_url:
        recorder = ReplayServer.recorder(upstream_url, out)
        with recorder.serve_in_thread() as url:
            first = run_claude(url, tmp_path / "home", "What is my weight?", mcp_url)

    assert [r.path for r in original.requests] == [r.path for r in recorder.requests]
    recorded = Scenario.load(out)
    assert len(recorded.scripts) == 1
    assert [len(script.turns) for script in recorded.scripts] == [2]

    replayed = ReplayServer(recorded)
    with replayed.serve_in_thread() as url:
        second = run_claude(url, tmp_path / "home", "What is my weight?", mcp_url)

    assert state.calls == ["weight", "weight"]
    assert "81.5 kg" in first.result["result"]
    assert second.result["result"] == first.result["result"]
    assert second.tool_calls == first.tool_calls
    assert second.result["usage"]["cache_read_input_tokens"] == 120


def test_error_turn_fails_the_run_quickly(tmp_path: Path) -> None:
    scenario = Scenario.from_dict(
        {"turn": [{"error": {"status": 529, "type": "overloaded_error", "message": "Overloaded"}}]}
    )
    with ReplayServer(scenario).serve_in_thread() as url:
        run = run_claude(url, tmp_path / "home", "Say hi")
    # Note the CLI still says subtype "success" here; is_error and the status tell.
    assert run.result["is_error"] is True
    assert run.result["api_error_status"] == 529
    assert "Overloaded" in run.result["result"]
    assert run.seconds < 15
