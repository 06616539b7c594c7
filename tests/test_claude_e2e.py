"""End to end: the real Claude Code CLI, the replay model server and the butler's real MCP server.

Every test here starts the CLI bundled in claude-agent-sdk as a real process,
through the Spawner, against a scripted scenario; tool calls reach the butler's
MCP server over HTTP (or SSE). Assertions look at what really happened: the
server's record of the call, what the child's own shell printed, live
processes in /proc, the temp directory on disk, the session row in SQLite.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spawnkit.config.credential_file import CredentialFile
from spawnkit.config.roster import ButlerConfig
from spawnkit.errors import QueueFullError, RuntimeNotFoundError
from spawnkit.events import Finished, RunEvent, Started, ToolCallStarted
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.result import OUTPUT_LIMIT
from spawnkit.runtimes import claude_code
from spawnkit.serve.service import REPLAY_API_KEY, ButlerService
from spawnkit.store import SessionStore

from .conftest import env_lines, processes_with_env, sessions_running, workspaces_of

pytestmark = pytest.mark.e2e


def scenario(text: str) -> Scenario:
    return Scenario.from_dict(tomllib.loads(text), source="<test>")


@asynccontextmanager
async def service(
    butler: ButlerConfig, store: SessionStore, script: str, **options: Any
) -> AsyncIterator[ButlerService]:
    async with ButlerService(butler, store=store, replay=scenario(script), **options) as svc:
        yield svc


def tracer() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


WEIGHT = """
[[turn]]
text = "Recording it."
tool = "mcp__*__state_set"
input = { key = "weight", value = "72.4 kg" }
[turn.usage]
input_tokens = 100
output_tokens = 20
cache_read_input_tokens = 50
cache_creation_input_tokens = 10
[[turn]]
tool = "mcp__*__state_get"
input = { key = "weight" }
usage = { input_tokens = 120, output_tokens = 10, cache_read_input_tokens = 70 }
[[turn]]
delay_ms = 600
text = "Your stored weight: {{ last_tool_result }}"
usage = { input_tokens = 140, output_tokens = 15, cache_read_input_tokens = 90 }
"""


async def test_mcp_tool_calls_stream_and_land_in_the_session(make_butler, store) -> None:
    butler = make_butler()
    provider, exporter = tracer()
    events: list[tuple[float, RunEvent]] = []
    async with service(butler, store, WEIGHT, tracer_provider=provider) as svc:
        result = await svc.trigger(
            "Please log my weight", on_event=lambda e: events.append((time.monotonic(), e))
        )

    assert result.success, result.error
    assert "72.4 kg" in result.output
    assert [(c.server, c.tool, c.status) for c in result.tool_calls] == [
        ("health", "state_set", "ok"),
        ("health", "state_get", "ok"),
    ]
    assert "72.4 kg" in (result.tool_calls[1].output or "")
    usage = result.usage
    assert (usage.input_tokens, usage.output_tokens) == (360, 45)
    assert (usage.cache_read_tokens, usage.cache_write_tokens) == (210, 10)
    assert result.cost_usd is not None and result.cost_usd > 0

    # The MCP server saw both calls, tied to this session through the URL.
    server_calls = store.mcp_calls(result.session_id)
    assert [(c["tool"], c["session_key"]) for c in server_calls] == [
        ("state_set", result.runtime_session_id),
        ("state_get", result.runtime_session_id),
    ]
    assert server_calls[0]["arguments"] == {"key": "weight", "value": "72.4 kg"}
    assert store.state_get("health", "weight") == "72.4 kg"

    record = store.get_session(result.session_id)
    assert record is not None
    assert (record.status, record.success, record.trigger_source) == ("success", True, "external")
    assert record.output == result.output
    assert [c.tool for c in record.tool_calls] == ["state_set", "state_get"]
    assert record.usage == result.usage and record.cost_usd == result.cost_usd
    assert record.runtime_session_id == result.runtime_session_id
    assert record.trace_id == result.trace_id and len(result.trace_id or "") == 32

    spans = {s.name: s for s in exporter.get_finished_spans()}
    run = spans["invoke_agent health"]
    assert format(run.context.trace_id, "032x") == result.trace_id
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.usage.input_tokens"] == 360
    assert run.attributes["gen_ai.usage.cache_read.input_tokens"] == 210
    tool_spans = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
    assert sorted(s.name for s in tool_spans) == [
        "execute_tool state_get",
        "execute_tool state_set",
    ]
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in tool_spans)

    # Tool calls reached the listener while the run was still going: the last
    # model turn waits 600 ms, so streamed events arrive well before the end.
    first_tool = next(t for t, e in events if isinstance(e, ToolCallStarted))
    finished = next(t for t, e in events if isinstance(e, Finished))
    assert finished - first_tool >= 0.5
    assert isinstance(events[0][1], Started)
    assert workspaces_of("health") == []


ENV_PROBE = """
[[turn]]
tool = "Bash"
input = { command = "env | sort", description = "show the environment" }
[[turn]]
text = "{{ last_tool_result }}"
"""


async def test_child_sees_only_declared_variables(make_butler, store, monkeypatch) -> None:
    monkeypatch.setenv("SPAWNKIT_CANARY", "must-not-leak")
    monkeypatch.setenv("OPTIONAL_SETTING", "from-env")
    monkeypatch.setenv("TRACEPARENT", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")  # ambient, stale
    CredentialFile.beside(store.path).set("REQUIRED_TOKEN", "from-credential-store")
    monkeypatch.setenv("REQUIRED_TOKEN", "from-env-loses")
    butler = make_butler(
        extra='[butler.env]\nrequired = ["REQUIRED_TOKEN"]\noptional = ["OPTIONAL_SETTING"]\n'
    )
    provider, _ = tracer()
    async with service(butler, store, ENV_PROBE, tracer_provider=provider) as svc:
        result = await svc.trigger("show env")
        # What the child's shell really printed reached the model unredacted.
        wire = str([r.body for r in svc.replay_server.requests])

    assert result.success, result.error
    seen = env_lines(result.tool_calls[0].output or "")
    assert "SPAWNKIT_CANARY" not in seen, "an undeclared host variable reached the child"
    assert "REQUIRED_TOKEN=from-credential-store" in wire and "from-env-loses" not in wire
    assert "OPTIONAL_SETTING=from-env" in wire
    # The model key reaches the child as a placeholder: the real one stays with the relay.
    assert re.search(r"ANTHROPIC_API_KEY=[A-Za-z0-9]{32}", wire), "a placeholder"
    assert f"ANTHROPIC_API_KEY={REPLAY_API_KEY}" not in wire
    # ... and spawnkit's own copy of it is redacted.
    assert seen["REQUIRED_TOKEN"] == "[redacted:REQUIRED_TOKEN]"
    assert seen["OPTIONAL_SETTING"] == "[redacted:OPTIONAL_SETTING]"
    assert seen["ANTHROPIC_API_KEY"] == "[redacted:ANTHROPIC_API_KEY]"
    assert seen["SPAWNKIT_SESSION_ID"] == result.session_id
    assert seen["SPAWNKIT_BUTLER"] == "health"
    assert seen["TRACEPARENT"].split("-")[1] == result.trace_id, "the run's own trace context"
    assert "SPAWNKIT_ENV_KEEP" not in seen and "SPAWNKIT_REAL_CLI" not in seen


async def test_no_trace_context_means_no_traceparent(make_butler, store, monkeypatch) -> None:
    monkeypatch.setenv("TRACEPARENT", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    async with service(make_butler(), store, ENV_PROBE) as svc:
        result = await svc.trigger("show env")
    assert result.success, result.error
    assert result.trace_id is None
    assert "TRACEPARENT" not in env_lines(result.tool_calls[0].output or "")


async def test_system_prompt_context_and_memory_reach_the_model(make_butler, store) -> None:
    butler = make_butler(
        extra="[modules.memory]\n",
        prompt="You are the health butler.\n<!-- @include shared/NOTIFY.md -->\n",
        files={
            "shared/NOTIFY.md": "Notify the user in one short sentence.",
            "shared/BUTLER_SKILLS.md": "Skills live under skills/.",
        },
    )
    script = '[[turn]]\ntext = "Noted: {{ prompt }}"\n'
    async with service(butler, store, script) as svc:
        first = await svc.trigger("remember the blue notebook", context="Today is Monday.")
        second = await svc.trigger("what did I ask before?")
        requests = [r for r in svc.replay_server.requests if r.path == "/v1/messages"]

    assert first.success and second.success
    assert first.output == "Noted: Today is Monday.\n\nremember the blue notebook"
    system = str(requests[0].body["system"])
    assert "You are the health butler." in system
    assert "Notify the user in one short sentence." in system
    assert "Skills live under skills/." in system
    assert "What you remember" not in system
    later = str(requests[-1].body["system"])
    assert "## What you remember from recent runs" in later
    assert "remember the blue notebook" in later


async def test_model_error_fails_fast_and_cleans_up(make_butler, store) -> None:
    script = (
        '[[turn]]\nerror = { status = 529, type = "overloaded_error", message = "Overloaded" }\n'
    )
    async with service(make_butler(), store, script) as svc:
        result = await svc.trigger("hello")
    assert not result.success and result.status == "failed"
    assert result.error_kind == "overloaded"
    assert "Overloaded" in (result.error or "") or "529" in (result.error or "")
    record = store.get_session(result.session_id)
    assert record is not None and record.status == "failed" and record.error == result.error
    assert workspaces_of("health") == []


async def test_model_server_down(make_butler, store, monkeypatch, unused_tcp_port) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    butler = make_butler(
        extra=f'[butler.runtime]\nbase_url = "http://127.0.0.1:{unused_tcp_port}"\n'
    )
    async with ButlerService(butler, store=store) as svc:
        result = await svc.trigger("hello")
    assert not result.success
    assert result.error_kind == "model_unavailable", result.error
    assert store.get_session(result.session_id).status == "failed"  # type: ignore[union-attr]


async def test_max_turns_is_enforced(make_butler, store) -> None:
    script = """
[[turn]]
tool = "mcp__*__state_list"
input = {}
[[turn]]
tool = "mcp__*__state_list"
input = {}
[[turn]]
text = "never reached"
"""
    async with service(make_butler(), store, script) as svc:
        result = await svc.trigger("loop", max_turns=1)
    assert not result.success and result.error_kind == "max_turns"
    assert "stopped at max_turns = 1. To allow more: --max-turns N" in (result.error or "")
    assert len(result.tool_calls) >= 1


SLOW = """
[[turn]]
delay_ms = 30000
text = "too late"
"""


async def test_cancellation_kills_the_cli_and_records(make_butler, store) -> None:
    started: list[Started] = []
    async with service(make_butler(), store, SLOW) as svc:
        task = asyncio.create_task(
            svc.trigger(
                "slow", on_event=lambda e: started.append(e) if isinstance(e, Started) else None
            )
        )
        async with asyncio.timeout(60):
            while not (
                started and processes_with_env("SPAWNKIT_SESSION_ID", started[0].session_id)
            ):
                await asyncio.sleep(0.05)
        session_id = started[0].session_id
        assert workspaces_of("health"), "the workspace exists while the run is going"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert processes_with_env("SPAWNKIT_SESSION_ID", session_id) == []
    assert workspaces_of("health") == []
    record = store.get_session(session_id)
    assert record is not None and record.status == "cancelled" and record.completed_at


async def test_a_killed_cli_is_a_recorded_crash(make_butler, store) -> None:
    script = """
[[turn]]
tool = "Bash"
input = { command = "kill -KILL $CLAUDE_PID", description = "kill the CLI" }
[[turn]]
text = "unreachable"
"""
    async with service(make_butler(), store, script) as svc:
        result = await svc.trigger("die")
    assert not result.success and result.error_kind == "crash", result.error
    assert store.get_session(result.session_id).status == "failed"  # type: ignore[union-attr]
    assert workspaces_of("health") == []
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id or "") == []


async def test_sse_transport(make_butler, store) -> None:
    butler = make_butler(extra='mcp_transport = "sse"\n')
    script = """
[[turn]]
tool = "mcp__*__state_set"
input = { key = "k", value = 1 }
[[turn]]
text = "ok"
"""
    async with service(butler, store, script) as svc:
        result = await svc.trigger("store it")
    assert result.success, result.error
    assert result.tool_calls[0].status == "ok"
    calls = store.mcp_calls(result.session_id)
    assert [(c["tool"], c["session_key"]) for c in calls] == [
        ("state_set", result.runtime_session_id)
    ]


LIMITED = """
[butler.runtime]
max_concurrent_sessions = {slots}
max_queued_sessions = {queue}
"""
DELAYED = '[[turn]]\ndelay_ms = {ms}\ntext = "done: {{{{ prompt }}}}"\n'


async def test_serial_dispatch_with_real_clis(make_butler, store) -> None:
    butler = make_butler(extra=LIMITED.format(slots=1, queue=5))
    most = 0

    async def sample() -> None:
        nonlocal most
        while True:
            most = max(most, len(sessions_running("health")))
            await asyncio.sleep(0.02)

    async with service(butler, store, DELAYED.format(ms=700)) as svc:
        sampler = asyncio.create_task(sample())
        results = await asyncio.gather(svc.trigger("one"), svc.trigger("two"), svc.trigger("three"))
        sampler.cancel()
    assert [r.output for r in results] == ["done: one", "done: two", "done: three"]
    assert most == 1, f"never more than one CLI at a time with one slot (saw {most})"
    # Each run holds the slot for at least its scripted 700 ms model delay.
    starts = sorted(r.started_at for r in store.list_sessions() if r.started_at)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 2 and min(gaps) >= 0.7, gaps


async def test_queue_full_with_real_clis(make_butler, store) -> None:
    butler = make_butler(extra=LIMITED.format(slots=1, queue=1))
    async with service(butler, store, DELAYED.format(ms=1500)) as svc:
        first = asyncio.create_task(svc.trigger("one"))
        second = asyncio.create_task(svc.trigger("two"))
        await asyncio.sleep(0.1)
        with pytest.raises(QueueFullError):
            await svc.trigger("three")
        results = await asyncio.gather(first, second)
    assert all(r.success for r in results)
    assert store.count_sessions() == 2


NESTED = """
[[script]]
match = "^outer"
  [[script.turn]]
  tool = "mcp__*__trigger"
  input = { prompt = "inner task" }
  [[script.turn]]
  text = "outer saw: {{ last_tool_result }}"
[[script]]
match = "inner task"
  [[script.turn]]
  text = "inner done"
"""


async def test_self_trigger_is_rejected_without_a_free_slot(make_butler, store) -> None:
    butler = make_butler(extra=LIMITED.format(slots=1, queue=5))
    async with service(butler, store, NESTED) as svc:
        result = await asyncio.wait_for(svc.trigger("outer run"), 120)
    assert result.success, result.error
    assert "rejected" in result.output and "deadlock" in result.output
    assert store.count_sessions() == 1


async def test_self_trigger_runs_a_nested_session_with_a_free_slot(make_butler, store) -> None:
    butler = make_butler(extra=LIMITED.format(slots=2, queue=5))
    async with service(butler, store, NESTED) as svc:
        result = await asyncio.wait_for(svc.trigger("outer run"), 120)
    assert result.success, result.error
    assert "inner done" in result.output
    sources = sorted((r.trigger_source, r.prompt) for r in store.list_sessions())
    assert sources == [("external", "outer run"), ("trigger", "inner task")]


async def test_drain_cancels_real_runs(make_butler, store) -> None:
    butler = make_butler(extra=LIMITED.format(slots=2, queue=5))
    async with service(butler, store, SLOW) as svc:
        tasks = [asyncio.create_task(svc.trigger(f"run {i}")) for i in range(3)]
        async with asyncio.timeout(60):
            while len(sessions_running("health")) < 2:
                await asyncio.sleep(0.05)
        svc.spawner.stop_accepting()
        summary = await svc.spawner.drain(timeout=0.5)
        results = await asyncio.gather(*tasks)
    assert summary == {"finished": 0, "cancelled": 3}
    assert [r.status for r in results] == ["cancelled"] * 3
    assert sorted(r.status for r in store.list_sessions()) == ["cancelled"] * 3
    assert processes_with_env("SPAWNKIT_BUTLER", "health") == []
    assert workspaces_of("health") == []


async def test_missing_cli_is_a_clear_error(
    make_butler, store, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(claude_code, "_bundled_cli", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    async with service(make_butler(), store, ENV_PROBE) as svc:
        with pytest.raises(RuntimeNotFoundError, match="npm install -g @anthropic-ai/claude-code"):
            await svc.trigger("hello")
    assert store.count_sessions() == 0


# A stand-in for the CLI that reads its prompt as `claude --print` does, or speaks just
# enough of the SDK's protocol (it answers the initialize request), and then misbehaves in
# the way a test asks for.
FAKE_CLI = """#!/usr/bin/env python3
import json, sys
if "--print" in sys.argv:
    sys.stdin.read()
else:
    request = json.loads(sys.stdin.readline())
    print(json.dumps({"type": "control_response", "response": {
        "subtype": "success", "request_id": request["request_id"], "response": {}}}), flush=True)
MODE
"""
# A butler asked about a tool is driven through the SDK's control protocol; others are
# `claude --print` (spawnkit.runtimes.claude_code).
WAYS = {"print": "", "sdk": '[butler.permissions]\nask = ["Write"]\n'}
MALFORMED = """
print("this is not JSON", flush=True)
print(json.dumps({"type": "mystery"}), flush=True)
sys.exit(3)
"""
ENDLESS = """
n = 0
while True:
    n += 1
    print(json.dumps({"type": "assistant", "message": {"id": f"m{n}", "model": "fake",
        "role": "assistant", "content": [{"type": "text", "text": "more " * 20}]}}), flush=True)
"""


def _fake_cli(tmp_path: Path, mode: str) -> Path:
    path = tmp_path / "fake-claude"
    path.write_text(FAKE_CLI.replace("MODE", mode))
    path.chmod(0o755)
    return path


class _FakeBinaryAdapter(claude_code.ClaudeCodeAdapter):
    binary: Path

    def find_binary(self) -> Path:
        return self.binary

    async def binary_version(self) -> str | None:
        return "fake"


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize(
    ("mode", "kinds"),
    [(MALFORMED, {"crash", "protocol"}), (ENDLESS, {"timeout"})],
    ids=["malformed-output", "endless-output"],
)
async def test_bad_cli_output_fails_cleanly(make_butler, store, tmp_path, mode, kinds, way) -> None:
    butler = make_butler(extra="[butler.runtime]\ntimeout_s = 3\n" + WAYS[way])
    adapter = _FakeBinaryAdapter(butler.runtime)
    _FakeBinaryAdapter.binary = _fake_cli(tmp_path, mode)
    async with ButlerService(
        butler, store=store, replay=scenario(ENV_PROBE), adapter=adapter
    ) as svc:
        result = await svc.trigger("hello")
    assert not result.success
    assert result.error_kind in kinds, (result.error_kind, result.error)
    record = store.get_session(result.session_id)
    assert record is not None and record.status == ("timeout" if mode is ENDLESS else "failed")
    if mode is ENDLESS:
        assert len(result.output) <= OUTPUT_LIMIT + 100, "partial output is bounded"
        assert "more more" in result.output
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id or "") == []
    assert workspaces_of("health") == []


async def test_base_url_and_model_from_butler_toml(make_butler, store, monkeypatch) -> None:
    """No replay wiring from spawnkit: the butler's own base_url must reach the CLI."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-local-gateway")
    replay = ReplayServer(scenario('[[turn]]\ntext = "via {{ prompt }}"\n'))
    async with replay.serve() as url:
        butler = make_butler(
            extra=f'[butler.runtime]\nbase_url = "{url}"\nmodel = "claude-sonnet-test"\n'
        )
        async with ButlerService(butler, store=store) as svc:
            result = await svc.trigger("the gateway")
    assert result.success, result.error
    assert result.output == "via the gateway"
    (request,) = [r for r in replay.requests if r.path == "/v1/messages"]
    assert request.body["model"] == "claude-sonnet-test"
    assert request.headers["x-api-key"] == "sk-local-gateway"
    assert store.get_session(result.session_id).model == "claude-sonnet-test"  # type: ignore[union-attr]


async def test_no_user_or_project_settings_leak_in(
    make_butler, store, monkeypatch, tmp_path: Path
) -> None:
    """Project .mcp.json, user settings and user MCP servers must not reach the run."""
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    intruder = {"type": "http", "url": "http://127.0.0.1:9/mcp"}
    (home / ".claude.json").write_text(json.dumps({"mcpServers": {"user_intruder": intruder}}))
    (home / ".claude" / "settings.json").write_text(
        json.dumps({"permissions": {"allow": ["Write", "WebFetch"]}, "model": "claude-user-pick"})
    )
    butler = make_butler()
    (butler.directory / ".mcp.json").write_text(
        json.dumps({"mcpServers": {"project_intruder": intruder}})
    )
    (butler.directory / ".claude").mkdir()
    (butler.directory / ".claude" / "settings.json").write_text(
        json.dumps({"enableAllProjectMcpServers": True})
    )
    async with service(butler, store, '[[turn]]\ntext = "tools: {{ tools }}"\n') as svc:
        result = await svc.trigger("which tools?")
        (request,) = [r for r in svc.replay_server.requests if r.path == "/v1/messages"]
    assert result.success, result.error
    offered = sorted(tool["name"] for tool in request.body["tools"])
    assert offered == sorted(
        ["Bash", "Read", "Glob", "Grep"]
        + [f"mcp__health__{t}" for t in ("state_get", "state_set", "state_list",
                                          "schedule_list", "sessions_list", "trigger")]
    )  # fmt: skip
    assert "intruder" not in result.output
    assert request.body["model"] != "claude-user-pick"


async def test_resume_continues_the_conversation_as_a_linked_session(make_butler, store) -> None:
    script = """
[[turn]]
text = "First answer to: {{ prompt }}"
[[turn]]
text = "Second answer, still in the same conversation: {{ prompt }}"
"""
    async with service(make_butler(), store, script) as svc:
        first = await svc.trigger("remember the number 42")
        second = await svc.spawner.resume(first.session_id or "", "what number was it?")
        requests = [r for r in svc.replay_server.requests if r.path == "/v1/messages"]
    assert first.success and second.success, second.error
    assert second.output.startswith("Second answer"), "the replay saw the earlier turn"
    assert "remember the number 42" in json.dumps(requests[-1].body["messages"])
    assert second.session_id != first.session_id
    assert second.runtime_session_id == first.runtime_session_id
    record = store.get_session(second.session_id or "")
    assert record is not None and record.parent_session_id == first.session_id


async def test_runtime_output_is_logged_per_session(make_butler, store) -> None:
    async with service(make_butler(), store, ENV_PROBE) as svc:
        result = await svc.trigger("show env")
    record = store.get_session(result.session_id or "")
    assert record is not None and record.log_dir is not None
    stdout = (record.log_dir / "stdout.log").read_text().splitlines()
    lines = [json.loads(line) for line in stdout]
    kinds = [(line["type"], line.get("subtype")) for line in lines]
    # The CLI's own messages, in its order: its start, the turns, its result.
    assert kinds.index(("system", "init")) < kinds.index(("result", "success"))
    assert [kind for kind, _ in kinds].count("assistant") == 2
    # Neither the token deltas nor the SDK's control protocol.
    assert not {kind for kind, _ in kinds} & {"stream_event", "control_response"}
    blocks = [
        block for line in lines if line["type"] in ("assistant", "user")
        for block in line["message"]["content"] if isinstance(block, dict)
    ]  # fmt: skip
    assert any(b["type"] == "tool_use" and b["name"] == "Bash" for b in blocks), blocks
    assert any(b["type"] == "tool_result" and b["tool_use_id"] for b in blocks), blocks


DELEGATING = """
[[script]]
match = "^Find out"
  [[script.turn]]
  tool = "Agent"
  # run_in_background = false: the role's answer comes back as this call's result.
  [script.turn.input]
  description = "look it up"
  prompt = "Research task: which planet is largest?"
  subagent_type = "researcher"
  run_in_background = false
  [[script.turn]]
  text = "The researcher says: {{ last_tool_result }}"
[[script]]
match = "^Research task"
  [[script.turn]]
  text = "Jupiter is the largest planet."
"""


async def test_a_run_delegates_to_a_butler_role(make_butler, store) -> None:
    butler = make_butler(
        extra="""
[butler.agents.researcher]
description = "Looks facts up and reports them in one sentence"
prompt = "You are the researcher. Answer in one sentence."
tools = ["Read"]
"""
    )
    assert set(butler.agents) == {"researcher"}
    async with service(butler, store, DELEGATING) as svc:
        result = await svc.trigger("Find out which planet is largest")
        requests = [r for r in svc.replay_server.requests if r.path == "/v1/messages"]
    assert result.success, result.error
    assert "Jupiter is the largest planet." in result.output
    delegation = next(c for c in result.tool_calls if c.tool == "Agent")
    assert delegation.input["subagent_type"] == "researcher" and delegation.status == "ok"
    sub = [r for r in requests if "Research task" in json.dumps(r.body["messages"])[:2000]]
    assert sub, "the sub-agent's own conversation reached the model"
    assert "You are the researcher" in str(sub[0].body["system"])


async def test_a_run_as_a_role_uses_its_prompt_and_identity(make_butler, store) -> None:
    butler = make_butler(
        extra='[butler.agents.writer]\ndescription = "Writes"\nprompt = "You are the writer."\n'
    )
    async with service(butler, store, ENV_PROBE) as svc:
        result = await svc.spawner.trigger("show env", role="writer")
        system = str(svc.replay_server.requests[-1].body["system"])
    assert result.success, result.error
    assert "You are the writer." in system and "You are the health butler" not in system
    assert env_lines(result.tool_calls[0].output or "")["SPAWNKIT_ROLE"] == "writer"
    assert store.get_session(result.session_id or "").role == "writer"  # type: ignore[union-attr]


async def test_each_run_home_is_seeded_with_the_clis_first_start_record(
    make_butler, store, tmp_path: Path
) -> None:
    """The CLI takes the seed as its own (no first-start migrations in an empty home)."""
    script = """
[[turn]]
shell = "cat $HOME/.claude.json"
[[turn]]
text = "{{ last_tool_result }}"
"""
    async with service(make_butler(), store, script) as svc:
        result = await svc.trigger("look at your home")
    assert result.success, result.error
    seen = result.tool_calls[0].output or ""
    config = json.loads(seen[: seen.rindex("}") + 1])
    assert config["migrationVersion"] == 15 and "firstStartTime" in config
    assert "userID" in config, "the CLI went on from the seed and added its own keys"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude.json").write_text('{"mine": 1}')
    claude_code.seed_home(home)
    assert json.loads((home / ".claude.json").read_text()) == {"mine": 1}, "never overwritten"
    claude_code.seed_home(tmp_path)
    assert (tmp_path / ".claude.json").stat().st_mode & 0o777 == 0o600
