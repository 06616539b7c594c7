"""End to end: ACP agents as spawnkit runtimes (``[butler.runtime] type = "acp"``).

The real agents (``gemini --acp``, ``claude-code-acp``, ``codex-acp``, pinned in
package.json) run through the Spawner inside the run's sandbox against the replay
server, each calling the butler's real MCP server over ACP's ``mcpServers``; a small
Python ACP agent (tests/fixtures/acp_agent.py) stands for an agent that asks for
permissions or dies mid-prompt.
"""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from spawnkit.config.roster import ButlerConfig
from spawnkit.replay import Scenario
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


async def test_real_agent_calls_the_butlers_mcp_server(make_butler, store, agent) -> None:
    butler = acp_butler(make_butler, AGENTS[agent])
    async with service(butler, store, MCP_CALL) as svc:
        result = await svc.trigger("log my weight")

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
    assert store.count_sessions() == 1
    assert processes_with_env("SPAWNKIT_SESSION_ID", result.session_id or "") == []
    assert workspaces_of("health") == []
