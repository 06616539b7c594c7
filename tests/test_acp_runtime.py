"""End to end: ACP agents as spawnkit runtimes (``[butler.runtime] type = "acp"``).

The real agents (``gemini --acp``, ``claude-code-acp``, ``codex-acp``, pinned in
package.json) run through the Spawner inside the run's sandbox against the replay
server, each calling the butler's real MCP server over ACP's ``mcpServers``; a small
Python ACP agent (tests/fixtures/acp_agent.py) stands for an agent that asks for
permissions or dies mid-prompt.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tomllib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from spawnkit.budgets.budget import list_price
from spawnkit.config.roster import ButlerConfig
from spawnkit.errors import RuntimeNotFoundError
from spawnkit.events import RunEvent, Started, ToolCallStarted, UsageUpdate
from spawnkit.permissions import Approver, PermissionDecision, PermissionRequest
from spawnkit.replay import Scenario
from spawnkit.result import Usage
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore

from .conftest import REPO, processes_with_env, workspaces_of

AGENTS = {
    "gemini": '["gemini", "--acp"]',
    "claude-code-acp": '["claude-code-acp"]',
    "codex-acp": '["codex-acp"]',
}
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (REPO / "node_modules" / ".bin" / "codex-acp").exists(),
        reason="the node CLIs are not installed (npm ci)",
    ),
]


@pytest.fixture(params=list(AGENTS))
def agent(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def acp_butler(make_butler: Any, command: str, extra: str = "") -> ButlerConfig:
    butler: ButlerConfig = make_butler(
        extra=f'[butler.runtime]\ntype = "acp"\ncommand = {command}\n{extra}'
    )
    return butler


@asynccontextmanager
async def service(
    butler: ButlerConfig, store: SessionStore, script: str, **options: Any
) -> AsyncIterator[ButlerService]:
    scenario = Scenario.from_dict(tomllib.loads(script), source="<test>")
    async with ButlerService(butler, store=store, replay=scenario, **options) as svc:
        yield svc


MCP_CALL = """
[[turn]]
text = "Recording it."
tool = "mcp__*__state_set"
input = { key = "weight", value = "72.4 kg" }
usage = { input_tokens = 100, output_tokens = 20 }
[[turn]]
text = "Stored: {{ last_tool_result }}"
usage = { input_tokens = 130, output_tokens = 12 }
"""


def kept_usage(events: list[UsageUpdate]) -> Callable[[RunEvent], None]:
    return lambda event: events.append(event) if isinstance(event, UsageUpdate) else None


async def test_real_agent_calls_the_butlers_mcp_server(make_butler, store, agent) -> None:
    butler = acp_butler(make_butler, AGENTS[agent])
    usages: list[UsageUpdate] = []
    async with service(butler, store, MCP_CALL) as svc:
        result = await svc.trigger("log my weight", on_event=kept_usage(usages))

    assert result.success, result.error
    assert result.runtime == "acp" and result.runtime_session_id
    assert result.output.startswith("Stored"), result.output
    (call,) = [c for c in result.tool_calls if c.server == "health"]
    assert (call.tool, call.status) == ("state_set", "ok"), call
    assert store.state_get("health", "weight") == "72.4 kg"
    (server_call,) = store.mcp_calls(result.session_id or "")
    assert server_call["tool"] == "state_set", "the MCP call is tied to this session"
    record = store.get_session(result.session_id or "")
    assert record is not None and (record.runtime, record.status) == ("acp", "success")
    assert [c.tool for c in record.tool_calls] == [c.tool for c in result.tool_calls]
    # The tokens the scenario served (claude-code-acp tells none, codex-acp only its
    # context window: the run's relay meters them), live in the run's events and in its
    # record, priced at the model the run asked for (claude-code-acp's own is unnamed).
    assert (record.usage.input_tokens, record.usage.output_tokens) == (230, 32), record.usage
    seen = [u.usage.input_tokens for u in usages]
    assert 100 in seen and seen[-1] == 230, "after the first model call, and at the end"
    assert record.cost_usd == list_price(record.model, record.usage)
    assert (record.cost_usd is None) == (agent == "claude-code-acp")
    assert store.count_sessions() == 1
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id or "") == []
    assert workspaces_of("health") == []


async def test_claude_code_acp_usage_is_metered_and_priced(make_butler, store) -> None:
    """claude-code-acp tells no usage: the relay's meter gives the run's tokens, live and
    in its record, priced at the model the butler names; `spawnkit run` prints them."""
    butler = acp_butler(
        make_butler, AGENTS["claude-code-acp"], extra='model = "claude-sonnet-4-5"\n'
    )
    usages: list[UsageUpdate] = []
    async with service(butler, store, MCP_CALL) as svc:
        result = await svc.trigger("log my weight", on_event=kept_usage(usages))
    assert result.success, result.error
    record = store.get_session(result.session_id or "")
    assert record is not None and record.model == "claude-sonnet-4-5"
    assert record.usage == Usage(input_tokens=230, output_tokens=32)
    assert [u.usage.input_tokens for u in usages] == [100, 230]
    assert record.cost_usd == list_price("claude-sonnet-4-5", record.usage) > 0


FIXTURE_AGENT = Path(__file__).parent / "fixtures" / "acp_agent.py"


def fixture_butler(make_butler: Any, *args: str, extra: str = "") -> ButlerConfig:
    command = json.dumps([sys.executable, str(FIXTURE_AGENT), *args])
    return acp_butler(make_butler, command, extra)


async def test_an_agent_that_exits_mid_prompt_fails_the_run(make_butler, store) -> None:
    events: list[Any] = []
    async with service(fixture_butler(make_butler, "die"), store, MCP_CALL) as svc:
        result = await svc.trigger("go", on_event=events.append)

    assert not result.success
    assert result.error_kind == "crash", result.error
    assert "exited with code 3 mid-prompt" in (result.error or "")
    assert "crashed on purpose" in (result.error or "")
    assert any(isinstance(e, ToolCallStarted) for e in events), "its updates were read"
    record = store.get_session(result.session_id or "")
    assert record is not None and record.status == "failed"
    assert store.count_sessions() == 1
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id or "") == []
    assert workspaces_of("health") == []


SLOW_TOOL = """
[[turn]]
text = "Waiting."
shell = "sleep 300"
[[turn]]
text = "never"
"""


async def test_cancel_mid_tool_leaves_a_cancelled_record_and_nothing_running(
    make_butler, store, agent
) -> None:
    started: list[str] = []
    tool_started = asyncio.Event()

    def on_event(event: Any) -> None:
        if isinstance(event, Started):
            started.append(event.session_id)
        if isinstance(event, ToolCallStarted):
            tool_started.set()

    async with service(acp_butler(make_butler, AGENTS[agent]), store, SLOW_TOOL) as svc:
        task = asyncio.create_task(svc.trigger("wait", on_event=on_event))
        async with asyncio.timeout(120):
            await tool_started.wait()
            while not processes_with_env("SPAWNKIT_SESSION_ID", started[0]):
                await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert processes_with_env("SPAWNKIT_SESSION_ID", started[0]) == []
    assert workspaces_of("health") == []
    record = store.get_session(started[0])
    assert record is not None and record.status == "cancelled"
    assert store.count_sessions() == 1


def answering(allowed: bool, asked: list[PermissionRequest]) -> Approver:
    async def approver(request: PermissionRequest) -> PermissionDecision:
        asked.append(request)
        return PermissionDecision(allowed=allowed, by="test", reason=None if allowed else "no")

    return approver


def ask(*tools: str) -> str:
    """A butler.toml section: ``tools`` run only after the approver said yes."""
    return f"[butler.permissions]\nask = {json.dumps(list(tools))}\n"


@pytest.mark.parametrize("allowed", [True, False])
async def test_claude_asks_before_a_tool_in_ask_and_the_answer_holds(
    make_butler, store, tmp_path: Path, allowed: bool
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    marker = out / "marker"
    asked: list[PermissionRequest] = []
    butler = acp_butler(
        make_butler, AGENTS["claude-code-acp"],
        f'tools = ["Read"]\n[butler.sandbox]\nwrite = ["{out}"]\n' + ask("Bash"),
    )  # fmt: skip
    script = f'[[turn]]\nshell = "touch {marker}"\n[[turn]]\ntext = "Done."\n'
    async with service(butler, store, script) as svc:
        result = await svc.trigger("make the marker", approver=answering(allowed, asked))

    assert result.success, result.error
    (request,) = asked
    assert request.call.name == "Bash" and str(marker) in json.dumps(request.call.input)
    assert marker.exists() is allowed, "the tool ran only when the approver said yes"
    (call,) = result.tool_calls
    assert call.status == ("ok" if allowed else "error")
    record = store.get_session(result.session_id or "")
    assert record is not None
    (answer,) = record.permissions  # the question and its answer are on the record
    assert answer.tool == "Bash" and answer.allowed is allowed


async def test_a_tool_outside_the_allow_list_is_denied_without_asking(
    make_butler,
    store,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "out" / "marker"
    marker.parent.mkdir()
    asked: list[PermissionRequest] = []
    extra = f'[butler.sandbox]\nwrite = ["{marker.parent}"]\n'
    butler = fixture_butler(make_butler, "ask", str(marker), extra=extra)
    async with service(butler, store, MCP_CALL) as svc:
        result = await svc.trigger("write it", approver=answering(True, asked))
    assert result.success, result.error
    assert result.output == "not allowed" and not marker.exists()
    assert asked == [], "nobody is asked about a tool that is simply not the butler's"
    (call,) = result.tool_calls
    assert call.status == "error"


async def test_an_agent_asks_about_a_tool_in_ask_by_its_kind(
    make_butler,
    store,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "out" / "marker"
    marker.parent.mkdir()
    asked: list[PermissionRequest] = []
    extra = f'[butler.sandbox]\nwrite = ["{marker.parent}"]\n' + ask("Write")
    butler = fixture_butler(make_butler, "ask", str(marker), extra=extra)
    async with service(butler, store, MCP_CALL) as svc:
        result = await svc.trigger("write it", approver=answering(True, asked))
    assert result.success, result.error
    assert result.output == "written" and marker.exists()
    (request,) = asked
    assert request.call.name == "Write marker" and request.call.input == {"path": str(marker)}


async def test_resume_continues_the_agents_session(make_butler, store, agent) -> None:
    script = """
[[turn]]
text = "First: {{ prompt }}"
[[turn]]
text = "Second, after {{ tools }}"
[[turn]]
text = "Third"
"""
    async with service(acp_butler(make_butler, AGENTS[agent]), store, script) as svc:
        first = await svc.trigger("remember 42")
        second = await svc.spawner.resume(first.session_id or "", "what was it?")
        seen_by_second = str([r for r in svc.replay_server.requests if r.method == "POST"][-1].body)
        # gemini --acp: a resume of a resumed chat (staged again from its fullest copy).
        third = await svc.spawner.resume(second.session_id or "", "and then?")
        seen_by_third = str([r for r in svc.replay_server.requests if r.method == "POST"][-1].body)
    assert first.success and second.success and third.success, (second.error, third.error)
    # Each answer is its prompt's alone: a session/load's replay of the chat is not in it.
    assert second.output.startswith("Second"), second.output
    assert third.output == "Third", third.output
    assert "remember 42" in seen_by_second, "the model saw the first prompt again"
    assert "First: remember 42" in seen_by_second, "and the first answer (whole turn)"
    assert "remember 42" in seen_by_third and "what was it?" in seen_by_third
    record = store.get_session(second.session_id or "")
    assert record is not None and record.parent_session_id == first.session_id


async def test_a_missing_agent_says_how_to_install_it(
    make_butler, store, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPAWNKIT_CODEX_ACP", str(tmp_path / "nowhere" / "codex-acp"))
    async with service(acp_butler(make_butler, AGENTS["codex-acp"]), store, MCP_CALL) as svc:
        with pytest.raises(RuntimeNotFoundError, match="npm install -g @zed-industries/codex-acp"):
            await svc.trigger("hello")
    assert store.count_sessions() == 0


async def test_max_turns_is_a_max_turns_failure(make_butler, store, agent) -> None:
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
    async with service(acp_butler(make_butler, AGENTS[agent]), store, script) as svc:
        result = await svc.trigger("loop", max_turns=1)
    assert not result.success and result.error_kind == "max_turns", result.error
    record = store.get_session(result.session_id or "")
    assert record is not None and record.status == "failed"
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id or "") == []
