"""End to end: the real Codex and Gemini CLIs through the Spawner, against the replay server.

Each test runs for both runtimes: the CLI (pinned in package.json, installed
by the test set-up) really starts, talks to the replay model server through
the Responses or Gemini API, and calls the butler's real MCP server.
"""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from spawnkit.config.roster import ButlerConfig
from spawnkit.errors import RuntimeNotFoundError
from spawnkit.events import Started
from spawnkit.notebook.hub import with_runtime
from spawnkit.replay import Scenario
from spawnkit.runtimes import get_adapter
from spawnkit.serve.service import REPLAY_API_KEY, ButlerService
from spawnkit.store import SessionStore

from .conftest import REPO, env_lines, processes_with_env, workspaces_of

RUNTIMES = ["codex", "gemini"]
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (REPO / "node_modules" / ".bin" / "codex").exists(),
        reason="the node CLIs are not installed (npm ci)",
    ),
]


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def service(
    butler: ButlerConfig, runtime: str, store: SessionStore, script: str, **options: Any
) -> AsyncIterator[ButlerService]:
    scenario = Scenario.from_dict(tomllib.loads(script), source="<test>")
    async with ButlerService(
        with_runtime(butler, runtime), store=store, replay=scenario, **options
    ) as svc:
        yield svc


TOOLS = """
[[turn]]
text = "Recording it."
tool = "mcp__*__state_set"
input = { key = "weight", value = "72.4 kg" }
usage = { input_tokens = 100, output_tokens = 20, cache_read_input_tokens = 50 }
[[turn]]
shell = "env | sort"
[[turn]]
text = "Stored, and the shell said: {{ last_tool_result }}"
usage = { input_tokens = 130, output_tokens = 12, cache_read_input_tokens = 70 }
"""


async def test_mcp_call_shell_usage_record_and_isolation(
    make_butler, store, runtime, monkeypatch
) -> None:
    monkeypatch.setenv("SPAWNKIT_CANARY", "must-not-leak")
    monkeypatch.setenv("OPTIONAL_SETTING", "declared")
    butler = make_butler(extra='[butler.env]\noptional = ["OPTIONAL_SETTING"]\n')
    async with service(butler, runtime, store, TOOLS) as svc:
        result = await svc.trigger("log my weight")
        # What the child's shell really printed reached the model unredacted.
        wire = str([r.body for r in svc.replay_server.requests])

    assert result.success, result.error
    assert result.runtime == runtime and result.runtime_session_id
    assert result.output.startswith("Stored, and the shell said:")
    mcp, shell = result.tool_calls
    assert (mcp.server, mcp.tool, mcp.status) == ("health", "state_set", "ok")
    assert mcp.input == {"key": "weight", "value": "72.4 kg"}
    assert shell.server is None and shell.status == "ok"
    assert store.state_get("health", "weight") == "72.4 kg"
    (server_call,) = store.mcp_calls(result.session_id or "")
    assert server_call["tool"] == "state_set", "the MCP call is tied to this session"
    assert result.usage.cache_read_tokens == 120 and result.usage.output_tokens > 0

    seen = env_lines(shell.output or "")
    assert "SPAWNKIT_CANARY" not in seen, "an undeclared host variable reached the child"
    assert "OPTIONAL_SETTING=declared" in wire
    assert seen.get("OPTIONAL_SETTING") == "[redacted:OPTIONAL_SETTING]", "spawnkit's copy"
    assert seen.get("SPAWNKIT_SESSION_ID") == result.session_id
    assert "ANTHROPIC_API_KEY" not in seen, "another vendor's key"
    if runtime == "gemini":
        # A placeholder: the real key stays with the run's relay.
        assert "GEMINI_API_KEY=" in wire and f"GEMINI_API_KEY={REPLAY_API_KEY}" not in wire
        assert "OPENAI_API_KEY" not in seen
        assert seen["GEMINI_API_KEY"] == "[redacted:GEMINI_API_KEY]"

    record = store.get_session(result.session_id or "")
    assert record is not None
    assert (record.runtime, record.status) == (runtime, "success")
    assert [c.tool for c in record.tool_calls] == [c.tool for c in result.tool_calls]
    assert record.usage == result.usage
    assert record.log_dir is not None and (record.log_dir / "stdout.log").stat().st_size > 0
    assert workspaces_of("health") == []


async def test_cancelling_a_run_kills_the_cli(make_butler, store, runtime) -> None:
    started: list[str] = []
    script = '[[turn]]\ndelay_ms = 60000\ntext = "late"\n'
    async with service(make_butler(), runtime, store, script) as svc:
        task = asyncio.create_task(
            svc.trigger(
                "slow",
                on_event=lambda e: started.append(e.session_id) if isinstance(e, Started) else None,
            )
        )
        async with asyncio.timeout(60):
            while not (started and processes_with_env("SPAWNKIT_SESSION_ID", started[0])):
                await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert processes_with_env("SPAWNKIT_SESSION_ID", started[0]) == []
    assert workspaces_of("health") == []
    record = store.get_session(started[0])
    assert record is not None and record.status == "cancelled"


async def test_model_server_down_fails_within_seconds(
    make_butler, store, runtime, unused_tcp_port, monkeypatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("GEMINI_API_KEY", "g-test")
    butler = make_butler(
        extra=f'[butler.runtime]\nbase_url = "http://127.0.0.1:{unused_tcp_port}"\ntimeout_s = 60\n'
    )
    async with ButlerService(with_runtime(butler, runtime), store=store) as svc:
        result = await svc.trigger("hello")
    assert not result.success
    assert result.error_kind == "model_unavailable", result.error
    assert result.duration_ms < 60_000, "it failed on its own, not on the run timeout"


async def test_missing_cli(make_butler, store, runtime, monkeypatch, tmp_path: Path) -> None:
    variable = get_adapter(runtime).binary_env  # type: ignore[attr-defined]
    monkeypatch.setenv(variable, str(tmp_path / "nowhere" / runtime))
    async with service(make_butler(), runtime, store, TOOLS) as svc:
        with pytest.raises(RuntimeNotFoundError, match="npm install -g"):
            await svc.trigger("hello")
    assert store.count_sessions() == 0


async def test_resume_is_a_linked_session(make_butler, store, runtime) -> None:
    script = """
[[turn]]
text = "First: {{ prompt }}"
[[turn]]
text = "Second, after {{ tools }}"
"""
    async with service(make_butler(), runtime, store, script) as svc:
        first = await svc.trigger("remember 42")
        second = await svc.spawner.resume(first.session_id or "", "what was it?")
        requests = [r for r in svc.replay_server.requests if r.method == "POST"]
    assert first.success and second.success, second.error
    assert second.output.startswith("Second"), "the replayed conversation continued"
    assert "remember 42" in str(requests[-1].body)
    record = store.get_session(second.session_id or "")
    assert record is not None and record.parent_session_id == first.session_id


async def test_max_turns(make_butler, store, runtime) -> None:
    script = """
[[turn]]
tool = "mcp__*__state_list"
input = {}
[[turn]]
tool = "mcp__*__state_list"
input = {}
[[turn]]
tool = "mcp__*__state_list"
input = {}
[[turn]]
text = "never"
"""
    async with service(make_butler(), runtime, store, script) as svc:
        result = await svc.trigger("loop", max_turns=1)
    assert not result.success and result.error_kind == "max_turns", result.error
    assert store.get_session(result.session_id or "").status == "failed"  # type: ignore[union-attr]
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id or "") == []


async def test_run_timeout(make_butler, store, runtime) -> None:
    butler = make_butler(extra="[butler.runtime]\ntimeout_s = 2\n")
    async with service(butler, runtime, store, '[[turn]]\ndelay_ms = 60000\ntext = "x"\n') as svc:
        result = await svc.trigger("slow")
    assert result.error_kind == "timeout" and "timed out after 2 s" in (result.error or "")
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id or "") == []


def test_capabilities() -> None:
    codex = get_adapter("codex")().capabilities()
    gemini = get_adapter("gemini")().capabilities()
    claude = get_adapter("claude-code")().capabilities()
    for caps in (codex, gemini, claude):
        assert caps["supports_mcp"] and caps["supports_resume"] and caps["supports_system_prompt"]
        assert isinstance(caps["supports_parallel_sessions"], bool)
    assert claude["supports_subagents"] and not codex["supports_subagents"]
    assert codex["supports_max_turns"] is False and gemini["supports_max_turns"] is True
