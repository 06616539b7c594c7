"""``[butler.permissions] ask`` with the real Claude Code CLI: its permission callback.

The CLI bundled in claude-agent-sdk runs against the replay server, which scripts a
``Write`` of a file into the run's working directory. Whether the file exists afterwards
says whether the tool really ran; the record and what the model was told say the rest.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import ClaudeAgentOptions
from claude_agent_sdk.types import (
    PermissionResultAllow,
    PermissionResultDeny,
    ToolPermissionContext,
)

from spawnkit.config.butler_config import AgentRole
from spawnkit.permissions import NO_APPROVER, PermissionDecision, PermissionRequest
from spawnkit.replay import Scenario
from spawnkit.runtimes.base import McpServerSpec, RunSpec
from spawnkit.runtimes.claude_code import ClaudeCodeAdapter, cli_options, sdk_options
from spawnkit.serve.service import ButlerService

from .conftest import processes_with_env, workspaces_of

e2e = pytest.mark.e2e

ASK = """
[butler.permissions]
ask = ["Write"]
"""


def write_then_report(path: Path) -> Scenario:
    """A Bash call (allowed without a question), a Write of ``path``, then the model
    says what the Write's result told it."""
    script = f"""
[[turn]]
shell = "echo still-allowed"
[[turn]]
tool = "Write"
input = {{ file_path = {json.dumps(str(path))}, content = "approved text" }}
[[turn]]
text = "The write said: {{{{ last_tool_result }}}}"
"""
    return Scenario.from_dict(tomllib.loads(script), source="<permissions>")


class Person:
    """An approver that answers ``allowed`` and keeps what it was asked."""

    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed
        self.asked: list[PermissionRequest] = []

    async def __call__(self, request: PermissionRequest) -> PermissionDecision:
        self.asked.append(request)
        return PermissionDecision(
            self.allowed, "test", reason=None if self.allowed else "not today"
        )


async def run(make_butler, store, tmp_path: Path, approver: Person | None):  # type: ignore[no-untyped-def]
    work = tmp_path / "work"
    work.mkdir()
    target = work / "note.txt"
    butler = make_butler(extra=ASK)
    async with ButlerService(butler, store=store, replay=write_then_report(target)) as svc:
        result = await svc.trigger("write the note", workdir=work, approver=approver)
    record = store.get_session(result.session_id)
    assert record is not None
    return result, record, target


@e2e
async def test_an_allowed_write_runs_and_is_recorded(make_butler, store, tmp_path: Path) -> None:
    person = Person(allowed=True)
    result, record, target = await run(make_butler, store, tmp_path, person)
    assert result.success, result.error
    assert target.read_text() == "approved text"
    (request,) = person.asked
    assert request.call.name == "Write" and request.call.input["file_path"] == str(target)
    assert request.session_id == result.session_id and request.butler == "health"
    bash, write = result.tool_calls
    assert (bash.name, bash.status, write.name, write.status) == ("Bash", "ok", "Write", "ok")
    assert "File created successfully" in result.output
    assert [(a.tool_call_id, a.tool, a.allowed, a.by) for a in record.permissions] == [
        (write.id, "Write", True, "test")
    ]


@e2e
async def test_a_denied_write_does_not_run_and_the_model_is_told(
    make_butler, store, tmp_path: Path
) -> None:
    person = Person(allowed=False)
    result, record, target = await run(make_butler, store, tmp_path, person)
    assert result.success, result.error
    assert not target.exists()
    bash, write = result.tool_calls
    assert write.status == "error" and "not today" in (write.output or "")
    assert bash.status == "ok", "a tool of [butler.runtime] tools is still allowed unasked"
    assert "not today" in result.output, "the model's next turn saw the denial"
    assert [(a.allowed, a.by, a.reason) for a in record.permissions] == [
        (False, "test", "not today")
    ]


@e2e
async def test_without_an_approver_the_write_is_denied_saying_why(
    make_butler, store, tmp_path: Path
) -> None:
    result, record, target = await run(make_butler, store, tmp_path, None)
    assert result.success, result.error
    assert not target.exists()
    assert NO_APPROVER.reason is not None
    assert NO_APPROVER.reason in (result.tool_calls[1].output or "")
    assert NO_APPROVER.reason in result.output, "the model was told why"
    assert [(a.allowed, a.by) for a in record.permissions] == [(False, "no approver")]


@e2e
async def test_a_run_cancelled_while_it_waits_for_an_answer(
    make_butler, store, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    target = work / "note.txt"
    asked = asyncio.Event()

    async def nobody_answers(request: PermissionRequest) -> PermissionDecision:
        asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    butler = make_butler(extra=ASK)
    async with ButlerService(butler, store=store, replay=write_then_report(target)) as svc:
        task = asyncio.create_task(
            svc.trigger("write the note", workdir=work, approver=nobody_answers)
        )
        async with asyncio.timeout(60):
            await asked.wait()
        (session_id,) = svc.spawner.in_flight
        assert await svc.spawner.cancel(session_id)
        result = await task
    assert result.status == "cancelled"
    assert not target.exists()
    record = store.get_session(session_id)
    assert record is not None and record.status == "cancelled"
    assert [(a.tool, a.allowed, a.by) for a in record.permissions] == [
        ("Write", False, "cancelled")
    ]
    assert processes_with_env("SPAWNKIT_SESSION_ID", session_id) == []
    assert workspaces_of("health") == []


@e2e
async def test_a_read_only_tool_in_ask_is_asked_too(make_butler, store, tmp_path: Path) -> None:
    """Claude Code lets Read through in its working directory unasked, unless a rule says ask."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "diary.txt").write_text("private words")
    script = f"""
[[turn]]
tool = "Read"
input = {{ file_path = {json.dumps(str(work / "diary.txt"))} }}
[[turn]]
text = "Read said: {{{{ last_tool_result }}}}"
"""
    person = Person(allowed=False)
    butler = make_butler(extra='[butler.permissions]\nask = ["Read"]\n')
    replay = Scenario.from_dict(tomllib.loads(script), source="<read>")
    async with ButlerService(butler, store=store, replay=replay) as svc:
        result = await svc.trigger("read my diary", workdir=work, approver=person)
    assert result.success, result.error
    assert [r.call.name for r in person.asked] == ["Read"]
    assert "private words" not in result.output and "not today" in result.output


# -- the options the adapter gives the SDK (pure) --------------------------------------


def spec_for(tmp_path: Path, ask: tuple[str, ...], prompt: str = "q", **more: Any) -> RunSpec:
    return RunSpec(
        session_id="s-1", butler="health", prompt=prompt, system_prompt="", workspace=tmp_path,
        cwd=tmp_path, mcp_server=McpServerSpec("health", "http", "http://127.0.0.1:1/mcp"),
        config_file=tmp_path / "mcp.json", env={}, max_turns=5, tools=("Bash", "Read"), ask=ask,
        **more,
    )  # fmt: skip


def options_for(tmp_path: Path, ask: tuple[str, ...]) -> ClaudeAgentOptions:
    spec = spec_for(tmp_path, ask)
    return ClaudeCodeAdapter().options(spec, tmp_path / "wrapper", tmp_path / "cli.pid")


def test_a_run_that_asks_nothing_is_claude_print_with_its_prompt_on_stdin(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, (), prompt="the plan nobody else may read")
    command = ClaudeCodeAdapter().print_command(spec)
    assert command is not None and command[-1] == "--print"
    assert "--input-format" not in command and "--permission-prompt-tool" not in command
    assert not any("nobody else" in arg for arg in command), "the prompt is not an argument"
    # The same command line the SDK builds from the same options (it checks no version).
    assert command[command.index("--permission-mode") + 1] == "dontAsk"
    assert command[command.index("--allowedTools") + 1] == "Bash,Read,mcp__health"
    assert command[command.index("--mcp-config") + 1] == str(tmp_path / "mcp.json")
    assert command[command.index("--system-prompt-file") + 1] == str(tmp_path / "system-prompt.md")


def test_a_run_asked_about_a_tool_or_with_roles_goes_through_the_sdk(tmp_path: Path) -> None:
    """Both need the SDK's control protocol: its permission callback, its initialize."""
    adapter = ClaudeCodeAdapter()
    assert adapter.print_command(spec_for(tmp_path, ("Write",))) is None
    role = AgentRole("finder", "finds things", "You find things.")
    assert adapter.print_command(spec_for(tmp_path, (), agents={"finder": role})) is None


def test_without_ask_nothing_is_asked(tmp_path: Path) -> None:
    options = options_for(tmp_path, ())
    assert (options.permission_mode, options.can_use_tool) == ("dontAsk", None)
    assert options.allowed_tools == ["Bash", "Read", "mcp__health"]
    assert cli_options(options) is options and sdk_options(options) is options


def test_ask_offers_the_tool_without_allowing_it(tmp_path: Path) -> None:
    options = options_for(tmp_path, ("Write", "mcp__health__state_set"))
    assert options.permission_mode == "default" and options.can_use_tool is not None
    assert options.tools == ["Bash", "Read", "Write"]
    # One of the server's tools is asked about: the server is not allowed as a whole.
    assert options.allowed_tools == ["Bash", "Read"]
    assert cli_options(options).permission_prompt_tool_name == "stdio"
    assert sdk_options(options).allowed_tools == []


async def test_the_callback_allows_the_butlers_own_mcp_tools_and_denies_strangers(
    tmp_path: Path,
) -> None:
    options = options_for(tmp_path, ("mcp__health__state_set",))
    callback = options.can_use_tool
    assert callback is not None
    context = ToolPermissionContext(tool_use_id="t-1")
    allowed = await callback("mcp__health__state_get", {}, context)
    assert isinstance(allowed, PermissionResultAllow)
    stranger = await callback("WebFetch", {}, context)
    assert isinstance(stranger, PermissionResultDeny) and "not among" in stranger.message
    asked = await callback("mcp__health__state_set", {"key": "k"}, context)  # nobody to ask
    assert isinstance(asked, PermissionResultDeny) and asked.message == NO_APPROVER.reason
