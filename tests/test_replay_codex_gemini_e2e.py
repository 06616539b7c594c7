"""The real Codex and Gemini CLIs against the replay server: MCP calls, usage, shell, errors.

One portable scenario drives all three runtimes (Claude Code too, for the MCP and shell
turns): ``tool = "mcp__*__state_get"`` matches each CLI's MCP tool, and ``shell = ...``
becomes each CLI's own shell tool. Every CLI runs as a subprocess with a fresh HOME (and a
private CODEX_HOME or GEMINI_CLI_HOME), TMPDIR, the offline settings of
``/work/shared/RUNTIMES.md`` and a timeout, against a replay server and a real MCP server on
local threads. The command-line and config builders here are test helpers, not the adapters.
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
from mcp.server.mcpserver import MCPServer

from spawnkit._asgi import serve_in_thread
from spawnkit.replay import ReplayServer, Scenario

REPO = Path(__file__).resolve().parent.parent
CODEX = REPO / "node_modules" / ".bin" / "codex"
GEMINI = REPO / "node_modules" / ".bin" / "gemini"
CLAUDE = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
CLI_TIMEOUT_S = 45
# An unknown slug: Codex then offers MCP tools directly instead of behind tool_search.
CODEX_MODEL = "replay-model"
GEMINI_MODEL = "gemini-2.5-flash"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
needs_codex = pytest.mark.skipif(not CODEX.exists(), reason="node_modules has no codex")
needs_gemini = pytest.mark.skipif(not GEMINI.exists(), reason="node_modules has no gemini")
needs_claude = pytest.mark.skipif(not CLAUDE.exists(), reason="the bundled claude is missing")

PORTABLE_SCENARIO = """
description = "One scenario for Claude Code, Codex and Gemini"

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

[[script]]
match = "(?i)run the shell"
  [[script.turn]]
  shell = "echo hi"
  [[script.turn]]
  text = "The shell said: {{ last_tool_result }}"

[[script]]
match = "(?i)fail"
  [[script.turn]]
  error = { status = 529, type = "overloaded_error", message = "Replayed overload" }
"""


def portable() -> Scenario:
    return Scenario.from_dict(tomllib.loads(PORTABLE_SCENARIO), source="portable.toml")


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
    async def state_get(key: str) -> str:
        """Read a stored value."""
        state.calls.append(key)
        return state.values.get(key, "unknown")

    app: Any = server.streamable_http_app()  # Starlette; uvicorn types ASGI apps stricter
    with serve_in_thread(app) as address:
        yield f"{address.url}/mcp", state


# --- command lines and config files ---------------------------------------------------


def codex_config(base_url: str, mcp_url: str | None = None) -> str:
    """``config.toml`` for a private CODEX_HOME: local provider, no retries, offline."""
    text = f"""
model = "{CODEX_MODEL}"
model_provider = "replay"
approval_policy = "never"
sandbox_mode = "read-only"

[model_providers.replay]
name = "replay"
base_url = "{base_url}/v1"
wire_api = "responses"
env_key = "REPLAY_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false
apps = false
remote_plugin = false
unbounded_connection_retries = false

[analytics]
enabled = false
"""
    if mcp_url is not None:
        text += f"""
[mcp_servers.health]
url = "{mcp_url}"
required = true
default_tools_approval_mode = "approve"
"""
    return text


def codex_command(prompt: str) -> list[str]:
    return [str(CODEX), "exec", "--json", "--skip-git-repo-check", "--ephemeral", prompt]


def gemini_settings(mcp_url: str | None = None) -> dict[str, Any]:
    """``settings.json``: API-key auth (else headless exits 41), no retries, offline."""
    settings: dict[str, Any] = {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"retryFetchErrors": False, "maxAttempts": 1, "disableAutoUpdate": True},
    }
    if mcp_url is not None:
        settings["mcpServers"] = {"health": {"type": "http", "url": mcp_url, "trust": True}}
    return settings


def gemini_command(prompt: str, allowed_tools: tuple[str, ...] = ()) -> list[str]:
    command = [str(GEMINI), "-m", GEMINI_MODEL, "-p", prompt, "--output-format", "stream-json"]
    for tool in allowed_tools:
        command += ["--allowed-tools", tool]
    return command


@dataclass(frozen=True)
class CliRun:
    runtime: str
    events: list[dict[str, Any]]
    returncode: int
    stderr: str
    seconds: float

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event.get("type") == kind]

    @property
    def final_text(self) -> str:
        if self.runtime == "codex":
            messages = [
                event["item"]["text"]
                for event in self.of_type("item.completed")
                if event["item"]["type"] == "agent_message"
            ]
            return messages[-1] if messages else ""
        if self.runtime == "gemini":
            return "".join(
                event["content"]
                for event in self.of_type("message")
                if event["role"] == "assistant"
            )
        return str(self.of_type("result")[0]["result"])

    @property
    def tool_calls(self) -> list[tuple[str, Any]]:
        if self.runtime == "codex":
            calls = []
            for event in self.of_type("item.completed"):
                item = event["item"]
                if item["type"] == "mcp_tool_call":
                    calls.append((f"{item['server']}/{item['tool']}", item["arguments"]))
                elif item["type"] == "command_execution":
                    calls.append(("shell", item["command"]))
            return calls
        if self.runtime == "gemini":
            return [(event["tool_name"], event["parameters"]) for event in self.of_type("tool_use")]
        return [
            (block["name"], block["input"])
            for event in self.of_type("assistant")
            for block in event["message"]["content"]
            if block.get("type") == "tool_use"
        ]


def run_cli(
    runtime: str, command: list[str], env: dict[str, str], cwd: Path, *, expect_events: str
) -> CliRun:
    started = time.monotonic()
    completed = subprocess.run(
        command,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,  # codex exec appends piped stdin to the prompt
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    seconds = time.monotonic() - started
    events = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    assert any(event.get("type") == expect_events for event in events), (
        f"{runtime}: no {expect_events} event (exit {completed.returncode}): "
        f"{completed.stdout[-2000:]}\n{completed.stderr[-2000:]}"
    )
    return CliRun(runtime, events, completed.returncode, completed.stderr, seconds)


def base_env(root: Path) -> dict[str, str]:
    home, tmp = root / "home", root / "tmp"
    for folder in (home, tmp, root / "work"):
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "NO_COLOR": "1",
    }


def run_codex(base_url: str, root: Path, prompt: str, mcp_url: str | None = None) -> CliRun:
    env = base_env(root)
    codex_home = root / "codex-home"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url, mcp_url))
    env |= {"CODEX_HOME": str(codex_home), "REPLAY_API_KEY": "replay"}
    ending = "turn.failed" if "fail" in prompt.lower() else "turn.completed"
    return run_cli("codex", codex_command(prompt), env, root / "work", expect_events=ending)


def run_gemini(
    base_url: str,
    root: Path,
    prompt: str,
    mcp_url: str | None = None,
    allowed_tools: tuple[str, ...] = (),
) -> CliRun:
    env = base_env(root)
    gemini_home = root / "gemini-home"
    (gemini_home / ".gemini").mkdir(parents=True, exist_ok=True)
    (gemini_home / ".gemini" / "settings.json").write_text(json.dumps(gemini_settings(mcp_url)))
    env |= {
        "GEMINI_CLI_HOME": str(gemini_home),
        "GEMINI_API_KEY": "replay",
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }
    return run_cli(
        "gemini",
        gemini_command(prompt, allowed_tools),
        env,
        root / "work",
        expect_events="result",
    )


def run_claude(
    base_url: str, root: Path, prompt: str, mcp_url: str, allowed: tuple[str, ...]
) -> CliRun:
    env = base_env(root) | {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "replay",
        "ENABLE_TOOL_SEARCH": "false",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    config = root / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"health": {"type": "http", "url": mcp_url}}}))
    command = [
        str(CLAUDE),
        "-p",
        prompt,
        "--output-format",
        "stream-json",
        "--verbose",
        "--setting-sources",
        "",
        "--mcp-config",
        str(config),
        "--strict-mcp-config",
        "--allowedTools",
        ",".join(allowed),
    ]
    return run_cli("claude", command, env, root / "work", expect_events="result")


# --- tests -------------------------------------------------------------------------------


@needs_codex
def test_codex_mcp_tool_call_and_usage(tmp_path: Path, health: tuple[str, HealthState]) -> None:
    mcp_url, state = health
    server = ReplayServer(portable())
    with server.serve_in_thread() as url:
        run = run_codex(url, tmp_path, "What is my weight?", mcp_url)

    assert state.calls == ["weight"]  # the real MCP tool ran
    assert run.returncode == 0
    # Codex hands the model mcp 2.x's structured result, {"result": "81.5 kg"}.
    assert run.final_text == 'Your weight is {"result":"81.5 kg"}.'
    assert run.tool_calls == [("health/state_get", {"key": "weight"})]
    # Codex sums the turns; its input_tokens include cached and cache-written tokens.
    assert run.of_type("turn.completed")[0]["usage"] == {
        "input_tokens": (100 + 50 + 10) + (130 + 70),
        "cached_input_tokens": 50 + 70,
        "cache_write_input_tokens": 10,
        "output_tokens": 20 + 12,
        "reasoning_output_tokens": 0,
    }

    model_calls = [r for r in server.requests if r.path == "/v1/responses"]
    assert len(model_calls) == 2
    offered = {tool.get("name"): tool for tool in model_calls[0].body["tools"]}
    assert [t["name"] for t in offered["mcp__health"]["tools"]] == ["state_get"]
    call, output = model_calls[1].body["input"][-2:]
    assert (call["namespace"], call["name"]) == ("mcp__health", "state_get")
    assert output["type"] == "function_call_output" and "81.5 kg" in output["output"]
    assert model_calls[0].headers["session-id"]


@needs_gemini
def test_gemini_mcp_tool_call_and_usage(tmp_path: Path, health: tuple[str, HealthState]) -> None:
    mcp_url, state = health
    server = ReplayServer(portable())
    with server.serve_in_thread() as url:
        run = run_gemini(url, tmp_path, "What is my weight?", mcp_url)

    assert state.calls == ["weight"]
    result = run.of_type("result")[0]
    assert result["status"] == "success" and run.returncode == 0
    # Gemini hands the model the text content: the value itself.
    assert run.final_text == "Let me look that up.Your weight is 81.5 kg."
    assert run.tool_calls == [("mcp_health_state_get", {"key": "weight"})]
    stats = result["stats"]
    assert stats["input_tokens"] == (100 + 50 + 10) + (130 + 70)  # prompt incl. cached
    assert stats["cached"] == 50 + 70
    assert stats["input"] == stats["input_tokens"] - stats["cached"]
    assert stats["output_tokens"] == 20 + 12
    assert stats["tool_calls"] == 1
    assert list(stats["models"]) == [GEMINI_MODEL]  # keyed by the response's modelVersion

    model_calls = [r for r in server.requests if ":streamGenerateContent" in r.path]
    assert len(model_calls) == 2
    assert all(r.query == "alt=sse" for r in model_calls)
    response = model_calls[1].body["contents"][-1]["parts"][0]["functionResponse"]
    assert response["name"] == "mcp_health_state_get"


@needs_claude
def test_claude_runs_the_same_portable_scenario(
    tmp_path: Path, health: tuple[str, HealthState]
) -> None:
    mcp_url, state = health
    allowed = ("Bash", "mcp__health__state_get")
    with ReplayServer(portable()).serve_in_thread() as url:
        mcp_run = run_claude(url, tmp_path / "a", "What is my weight?", mcp_url, allowed)
        shell_run = run_claude(url, tmp_path / "b", "Run the shell", mcp_url, allowed)
    assert state.calls == ["weight"]
    assert mcp_run.final_text == 'Your weight is {"result":"81.5 kg"}.'
    assert shell_run.tool_calls == [("Bash", {"command": "echo hi"})]
    assert shell_run.final_text == "The shell said: hi"


@needs_codex
def test_codex_shell_turn(tmp_path: Path) -> None:
    server = ReplayServer(portable())
    with server.serve_in_thread() as url:
        run = run_codex(url, tmp_path, "Run the shell")
    assert run.tool_calls == [("shell", "/bin/bash -lc 'echo hi'")]
    assert run.final_text == "The shell said: hi"
    call = server.requests[-1].body["input"][-2]
    assert (call["name"], json.loads(call["arguments"])) == ("exec_command", {"cmd": "echo hi"})


@needs_gemini
def test_gemini_shell_turn(tmp_path: Path) -> None:
    # Headless Gemini offers run_shell_command only if allowed (or with --approval-mode yolo).
    with ReplayServer(portable()).serve_in_thread() as url:
        run = run_gemini(url, tmp_path, "Run the shell", allowed_tools=("run_shell_command",))
    assert run.tool_calls == [("run_shell_command", {"command": "echo hi"})]
    assert run.of_type("tool_result")[0]["status"] == "success"
    assert run.final_text == "The shell said: hi"


@needs_codex
def test_codex_error_turn_fails_quickly(tmp_path: Path) -> None:
    with ReplayServer(portable()).serve_in_thread() as url:
        run = run_codex(url, tmp_path, "Please fail")
    assert run.returncode != 0
    assert "Replayed overload" in run.of_type("turn.failed")[0]["error"]["message"]
    assert run.seconds < 10


@needs_gemini
def test_gemini_error_turn_fails_quickly(tmp_path: Path) -> None:
    """An overloaded answer ends the run at once: one request, no retries with back-off
    (counted at the server: a time bound failed on a loaded machine, at 15.2 s)."""
    server = ReplayServer(portable())
    with server.serve_in_thread() as url:
        run = run_gemini(url, tmp_path, "Please fail")
    result = run.of_type("result")[0]
    assert run.returncode != 0
    assert result["status"] == "error"
    assert "Replayed overload" in result["error"]["message"]
    assert [r.path for r in server.requests] == [
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    ]


@needs_codex
def test_codex_record_then_replay(tmp_path: Path, health: tuple[str, HealthState]) -> None:
    mcp_url, state = health
    out = tmp_path / "recorded.toml"
    original = ReplayServer(portable())
    with original.serve_in_thread() as upstream_url:
        recorder = ReplayServer.recorder(upstream_url, out)
        with recorder.serve_in_thread() as url:
            first = run_codex(url, tmp_path / "first", "What is my weight?", mcp_url)

    assert [r.path for r in original.requests] == [r.path for r in recorder.requests]
    recorded = Scenario.load(out)
    assert [len(script.turns) for script in recorded.scripts] == [2]
    assert 'tool = "mcp__health__state_get"' in out.read_text()

    with ReplayServer(recorded).serve_in_thread() as url:
        second = run_codex(url, tmp_path / "second", "What is my weight?", mcp_url)
    assert state.calls == ["weight", "weight"]
    assert "81.5 kg" in first.final_text
    assert second.final_text == first.final_text
    assert second.tool_calls == first.tool_calls
    usage = [run.of_type("turn.completed")[0]["usage"] for run in (first, second)]
    assert usage[0] == usage[1]


@needs_gemini
def test_gemini_record_then_replay(tmp_path: Path, health: tuple[str, HealthState]) -> None:
    mcp_url, state = health
    out = tmp_path / "recorded.toml"
    original = ReplayServer(portable())
    with original.serve_in_thread() as upstream_url:
        recorder = ReplayServer.recorder(upstream_url, out)
        with recorder.serve_in_thread() as url:
            first = run_gemini(url, tmp_path / "first", "What is my weight?", mcp_url)

    recorded = Scenario.load(out)
    assert [len(script.turns) for script in recorded.scripts] == [2]
    assert 'tool = "mcp__health__state_get"' in out.read_text()

    with ReplayServer(recorded).serve_in_thread() as url:
        second = run_gemini(url, tmp_path / "second", "What is my weight?", mcp_url)
    assert state.calls == ["weight", "weight"]
    assert first.final_text == "Let me look that up.Your weight is 81.5 kg."
    assert second.final_text == first.final_text
    assert second.tool_calls == first.tool_calls
    stats = [run.of_type("result")[0]["stats"] for run in (first, second)]
    for key in ("input_tokens", "output_tokens", "cached", "input"):
        assert stats[0][key] == stats[1][key]
