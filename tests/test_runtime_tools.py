"""Each runtime offers the model the butler's tools and nothing else (what the model
receives is read from the replay server's log, so this is what the real CLI sent)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from spawnkit.config.roster import load_roster
from spawnkit.serve.service import ButlerService

from .conftest import REPO

pytestmark = pytest.mark.e2e

SCENARIO = REPO / "roster" / "general" / "scenarios" / "assistant.toml"
MCP = {"state_get", "state_set", "state_list", "schedule_list", "sessions_list", "trigger"}


def offered(body: Any) -> set[str]:
    """Tool names in one model request of any of the three wire formats."""
    names: set[str] = set()
    for tool in body.get("tools") or []:
        if "functionDeclarations" in tool:
            names |= {f["name"] for f in tool["functionDeclarations"]}
        elif tool.get("type") == "namespace":
            names |= {f"{tool['name']}.{t['name']}" for t in tool.get("tools", [])}
        else:
            names.add(tool.get("name") or tool.get("type"))
    return names


async def tools_of(runtime: str, tools: tuple[str, ...]) -> set[str]:
    butler = load_roster(REPO / "roster")["general"].with_runtime(runtime)
    butler = replace(butler, runtime=replace(butler.runtime, tools=tools))
    async with ButlerService(butler, replay=SCENARIO) as service:
        result = await service.trigger("hello")
        bodies = [r.body for r in service.replay_server.requests]  # type: ignore[union-attr]
    assert result.success, result.error
    return next(offered(body) for body in bodies if isinstance(body, dict) and body.get("tools"))


EXPECTED = {
    "claude-code": (
        {"Bash", "Read", "Glob", "Grep"},
        {f"mcp__general__{t}" for t in MCP},
        # The sub-agent tool: the general butler has a role (researcher) to delegate to.
        {"Agent"},
    ),
    "codex": (
        {"exec_command", "write_stdin"},
        {f"mcp__general.{t}" for t in MCP} | {"mcp__general"},
        # Codex's MCP resource tools: they reach only the butler's server.
        {"list_mcp_resources", "list_mcp_resource_templates", "read_mcp_resource"},
    ),
    "gemini": (
        {"run_shell_command", "read_file", "list_directory", "glob", "grep_search"},
        {f"mcp_general_{t}" for t in MCP},
        set(),
    ),
}


@pytest.mark.parametrize("runtime", sorted(EXPECTED))
async def test_only_the_butlers_tools_are_offered(runtime: str) -> None:
    builtin, mcp, resources = EXPECTED[runtime]
    names = await tools_of(runtime, ("Bash", "Read", "Glob", "Grep"))
    assert builtin <= names
    assert names - builtin - mcp - resources == set()


@pytest.mark.parametrize("runtime", sorted(EXPECTED))
async def test_a_butler_without_built_in_tools_gets_only_its_mcp_tools(runtime: str) -> None:
    builtin, mcp, resources = EXPECTED[runtime]
    names = await tools_of(runtime, ())
    assert not names & builtin
    assert names - mcp - resources == set()
