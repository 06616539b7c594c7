"""``spawnkit acp``: a butler as an ACP agent, driven over stdio by the SDK's real client.

The end-to-end tests start ``spawnkit acp`` as a process, with the real Claude Code CLI
(and Codex) against the replay model server and the butler's real MCP server, and check
what an ACP client sees (the updates in order, the stop reason) and what spawnkit keeps
(one record per prompt, nothing left running). The pure mapping from run events to ACP
updates is tested first, on events as the runtimes emit them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
from acp import RequestError, text_block

from spawnkit.events import AssistantText, TextDelta, ToolCallFinished, ToolCallStarted
from spawnkit.result import BudgetReport, SpawnerResult, ToolCall
from spawnkit.serve.acp.updates import UpdateStream, edit_diffs, stop_of, tool_call_started
from spawnkit.store import SessionStore

from .acp_client import AgentProcess, RecordingClient, agent_process
from .conftest import REPO, processes_with_env, workspaces_of

NOW = datetime(2026, 11, 27, tzinfo=UTC)

# -- the mapping, on events as the runtimes emit them ------------------------------------


def _call(name: str, **tool_input: object) -> ToolCall:
    return ToolCall.start("c1", name, dict(tool_input), NOW)


def test_text_goes_out_once_as_deltas_or_as_the_whole_block() -> None:
    stream = UpdateStream()
    streamed = [
        *stream.updates(TextDelta("s", "Hel")),
        *stream.updates(TextDelta("s", "lo")),
        *stream.updates(AssistantText("s", "Hello")),  # Claude Code: the block after its deltas
        *stream.updates(AssistantText("s", "Done")),  # Codex: whole blocks only
    ]
    texts = [u.content.text for u in streamed]  # type: ignore[union-attr]
    assert texts == ["Hel", "lo", "Done\n\n"]
    assert {u.session_update for u in streamed} == {"agent_message_chunk"}


def test_tool_calls_carry_kind_status_locations_and_output() -> None:
    stream = UpdateStream()
    read = _call("Read", file_path="/work/notes.md")
    (started,) = stream.updates(ToolCallStarted("s", read))
    (finished,) = stream.updates(ToolCallFinished("s", read.finish("hello", False, NOW)))
    assert (started.session_update, started.kind, started.status) == (  # type: ignore[union-attr]
        "tool_call", "read", "in_progress",
    )  # fmt: skip
    assert [loc.path for loc in started.locations] == ["/work/notes.md"]  # type: ignore[union-attr]
    assert (finished.session_update, finished.status) == ("tool_call_update", "completed")  # type: ignore[union-attr]
    assert finished.content[0].content.text == "hello"  # type: ignore[union-attr]
    failed = ToolCallFinished("s", _call("mcp__health__state_get").finish("boom", True, NOW))
    (update,) = stream.updates(failed)
    assert (update.kind, update.status) == ("other", "failed")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "tool_input", "expected"),
    [
        ("Edit", {"file_path": "/w/a.py", "old_string": "x = 1", "new_string": "x = 2"},
         [("/w/a.py", "x = 1", "x = 2")]),
        ("MultiEdit", {"file_path": "/w/a.py", "edits": [
            {"old_string": "a", "new_string": "b"}, {"old_string": "c", "new_string": "d"}]},
         [("/w/a.py", "a", "b"), ("/w/a.py", "c", "d")]),
        ("Write", {"file_path": "/w/new.txt", "content": "hi\n"}, [("/w/new.txt", None, "hi\n")]),
        ("replace", {"file_path": "/w/g.py", "old_string": "old", "new_string": "new"},
         [("/w/g.py", "old", "new")]),
        ("write_file", {"file_path": "/w/g.txt", "content": "g"}, [("/w/g.txt", None, "g")]),
        ("Bash", {"command": "ls"}, []),
    ],
)  # fmt: skip
def test_edits_become_acp_diffs(
    name: str, tool_input: dict[str, object], expected: list[tuple[str, str | None, str]]
) -> None:
    diffs = edit_diffs(_call(name, **tool_input))
    assert [(d.path, d.old_text, d.new_text) for d in diffs] == expected
    assert all(d.type == "diff" for d in diffs)


def test_codex_file_change_names_its_files() -> None:
    change = _call("file_change", changes=[{"path": "/w/a.py", "kind": "update"}])
    update = tool_call_started(change)
    assert update.kind == "edit"
    assert [loc.path for loc in update.locations or []] == ["/w/a.py"]


@pytest.mark.parametrize(
    ("result", "reason", "says"),
    [
        (SpawnerResult(), "end_turn", None),
        (SpawnerResult(success=False, status="cancelled"), "cancelled", None),
        (SpawnerResult(success=False, status="failed", error_kind="max_turns",
                       error="reached the max_turns limit (3)"), "max_turn_requests", "max_turns"),
        (SpawnerResult(success=False, status="budget", budget=BudgetReport(
            stopped_by="max_tokens", limit=1000, reached=1200)), "max_tokens", "max_tokens = 1000"),
        (SpawnerResult(success=False, status="budget", budget=BudgetReport(
            stopped_by="max_cost_usd", limit=0.5, reached=0.51)), "max_tokens", "max_cost_usd"),
        (SpawnerResult(success=False, status="failed", error="claude: no API key: set "
                       "ANTHROPIC_API_KEY", session_id="abc"), "end_turn", "set ANTHROPIC_API_KEY"),
    ],
)  # fmt: skip
def test_how_a_run_ends_a_prompt(result: SpawnerResult, reason: str, says: str | None) -> None:
    stop, message = stop_of(result)
    assert stop == reason
    if says is None:
        assert message is None
    else:
        assert message is not None and says in message


def test_claude_code_resumes_the_newest_kept_transcript(tmp_path: Path) -> None:
    """A session resumed twice is kept once per run's workspace; the newest copy holds the
    whole conversation (the third prompt of an ACP session resumed the first run's)."""
    from spawnkit.config.butler_config import RuntimeConfig
    from spawnkit.runtimes.claude_code import ClaudeCodeAdapter

    adapter = ClaudeCodeAdapter(RuntimeConfig(type="claude-code"))
    kept = adapter.kept_transcripts()
    assert kept is not None
    for folder in ["-ws-a", "-ws-b", "-ws-c"]:
        (kept / folder).mkdir(parents=True)
        (kept / folder / "abc.jsonl").write_text("an older run\n")
    # The newest copy is the one the directory lists last, whatever its order.
    *older, newest = kept.glob("*/abc.jsonl")
    newest.write_text("the latest run\n")
    for n, path in enumerate([*older, newest]):
        os.utime(path, ns=(10**18 + n, 10**18 + n))
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    assert adapter.stage_resume(home, cwd, "abc")
    (staged,) = (home / ".claude" / "projects").glob("*/abc.jsonl")
    assert staged.read_text() == "the latest run\n"


def test_the_zed_settings_in_the_docs_start_spawnkit_acp() -> None:
    import json
    import re

    from spawnkit.cli import build_parser

    doc = (REPO / "docs" / "acp-agent.md").read_text()
    block = re.search(r"```json\n(.*?)```", doc, re.S)
    assert block is not None
    (server,) = json.loads(block.group(1))["agent_servers"].values()
    assert server["command"] == "spawnkit" and server["type"] == "custom"
    args = build_parser().parse_args(server["args"])
    assert (args.command, args.butler, args.roster) == ("acp", "health", Path("/home/me/roster"))


def test_only_the_protocol_reaches_the_client_stdout(tmp_path: Path) -> None:
    """After claim_stdio, a print and a child process writing to fd 1 reach stderr; the
    protocol's descriptor is the one that reaches the client."""
    script = textwrap.dedent("""
        import os, subprocess
        from spawnkit.serve.acp.wire import claim_stdio
        stdio = claim_stdio()
        print("a stray print", flush=True)
        subprocess.run(["echo", "a child's line"], check=True)
        os.write(stdio.write_fd, b'{"jsonrpc": "2.0", "method": "ok"}\\n')
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"jsonrpc": "2.0", "method": "ok"}\n'
    assert "a stray print" in done.stderr and "a child's line" in done.stderr


# -- end to end: spawnkit acp as a process ---------------------------------------------------

CONVERSATION = """
[[turn]]
text = "Looking it up."
tool = "mcp__*__state_get"
input = { key = "weight" }
usage = { input_tokens = 100, output_tokens = 20 }
[[turn]]
text = "Writing a note."
tool = "Write"
input = { file_path = "/tmp/acp-note.txt", content = "weight noted\\n" }
[[turn]]
text = "First answer."
[[turn]]
text = "Second answer."
[[turn]]
text = "Third answer."
"""

SLOW_TOOL = """
[[turn]]
text = "Sleeping."
shell = "sleep 300"
[[turn]]
text = "Woke up."
"""


def _butler(make_butler, runtime: str = "claude-code", tools: str = '["Bash", "Write"]') -> Path:
    butler = make_butler(
        extra=textwrap.dedent(f"""
            [butler.runtime]
            type = "{runtime}"
            tools = {tools}
        """)
    )
    return Path(butler.roster_dir)


def _scenario(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.toml"
    path.write_text(text)
    return path


def _args(roster: Path, scenario: Path) -> tuple[str, ...]:
    return ("--butler", "health", "--roster", str(roster), "--replay", str(scenario))


def _records() -> list:
    return sorted(SessionStore().list_sessions(limit=100), key=lambda r: r.created_at)


def _assert_nothing_left() -> None:
    assert processes_with_env("SPAWNKIT_BUTLER", "health") == []
    assert workspaces_of("health") == []


async def _prompt(agent: AgentProcess, session_id: str, text: str):
    return await asyncio.wait_for(
        agent.conn.prompt(session_id=session_id, prompt=[text_block(text)]), 180
    )


@pytest.mark.e2e
async def test_a_prompt_streams_its_run_and_leaves_one_record(make_butler, tmp_path) -> None:
    roster = _butler(make_butler)
    async with agent_process(tmp_path, *_args(roster, _scenario(tmp_path, CONVERSATION))) as agent:
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        response = await _prompt(agent, session.session_id, "how much do I weigh?")
    client = agent.client
    assert response.stop_reason == "end_turn", agent.log()
    assert set(client.sessions) == {session.session_id}
    kinds = [u["sessionUpdate"] for u in client.updates if u["sessionUpdate"] != "usage_update"]
    # Text, then the MCP call, then text and the Write, then the answer: in the run's order.
    assert kinds == [
        "agent_message_chunk", "tool_call", "tool_call_update",
        "agent_message_chunk", "tool_call", "tool_call_update", "agent_message_chunk",
    ], client.updates  # fmt: skip
    assert client.text() == "Looking it up.Writing a note.First answer."
    mcp_start, write_start = client.of_kind("tool_call")
    mcp_done, write_done = client.of_kind("tool_call_update")
    assert mcp_start["title"] == "health.state_get" and mcp_start["kind"] == "other"
    assert mcp_start["rawInput"] == {"key": "weight"}
    assert (mcp_done["toolCallId"], mcp_done["status"]) == (mcp_start["toolCallId"], "completed")
    assert '"found":false' in mcp_done["content"][0]["content"]["text"]  # the real server's
    # The Write is an edit with its diff, and the file as its location.
    assert write_start["kind"] == "edit"
    assert write_start["locations"] == [{"path": "/tmp/acp-note.txt"}]
    diff = write_start["content"][0]
    assert (diff["type"], diff["path"], diff["newText"]) == (
        "diff", "/tmp/acp-note.txt", "weight noted\n"
    )  # fmt: skip
    assert write_done["status"] == "completed" and write_done["kind"] == "edit"
    usage = client.of_kind("usage_update")[-1]
    assert usage["used"] > 0 and usage["_meta"]["spawnkit"]["inputTokens"] >= 100
    assert usage["cost"]["currency"] == "USD"
    # Exactly one record: the run, under the ACP session's id.
    (record,) = _records()
    assert record.id == session.session_id == response.field_meta["spawnkit"]["sessionId"]
    assert record.status == "success" and record.prompt == "how much do I weigh?"
    assert [c.tool for c in record.tool_calls] == ["state_get", "Write"]
    _assert_nothing_left()


@pytest.mark.e2e
async def test_prompts_continue_the_conversation_and_load_replays_it(make_butler, tmp_path) -> None:
    roster = _butler(make_butler)
    args = _args(roster, _scenario(tmp_path, CONVERSATION))
    async with agent_process(tmp_path, *args) as agent:
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        first = await _prompt(agent, sid, "how much do I weigh?")
        before = len(agent.client.updates)
        second = await _prompt(agent, sid, "and yesterday?")
    assert (first.stop_reason, second.stop_reason) == ("end_turn", "end_turn"), agent.log()
    # The model saw the first prompt's three turns: the runtime session was resumed.
    second_text = "".join(
        u["content"]["text"]
        for u in agent.client.updates[before:]
        if u["sessionUpdate"] == "agent_message_chunk"
    )
    assert second_text == "Second answer."
    one, two = _records()
    assert (one.id, two.parent_session_id) == (sid, sid)
    assert two.status == "success" and two.runtime_session_id == one.runtime_session_id

    # A new agent process (a restarted client) loads the session and goes on from it.
    async with agent_process(tmp_path, *args) as agent:
        await asyncio.wait_for(
            agent.conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[]), 60
        )
        replayed = list(agent.client.updates)
        third = await _prompt(agent, sid, "thanks")
    users = [u["content"]["text"] for u in replayed if u["sessionUpdate"] == "user_message_chunk"]
    assert users == ["how much do I weigh?", "and yesterday?"]
    calls = [u for u in replayed if u["sessionUpdate"] == "tool_call"]
    assert [c["title"] for c in calls] == ["health.state_get", "Write /tmp/acp-note.txt"]
    done = [u for u in replayed if u["sessionUpdate"] == "tool_call_update"]
    assert [u["status"] for u in done] == ["completed", "completed"]
    answers = "".join(
        u["content"]["text"] for u in replayed if u["sessionUpdate"] == "agent_message_chunk"
    )
    assert "First answer." in answers and "Second answer." in answers
    assert third.stop_reason == "end_turn"
    assert "Third answer." in agent.client.text()
    records = _records()
    assert len(records) == 3 and records[2].parent_session_id == two.id
    _assert_nothing_left()


@pytest.mark.e2e
async def test_cancel_mid_tool_records_cancelled_and_leaves_nothing(make_butler, tmp_path) -> None:
    roster = _butler(make_butler)
    async with agent_process(tmp_path, *_args(roster, _scenario(tmp_path, SLOW_TOOL))) as agent:
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        prompt = asyncio.create_task(_prompt(agent, session.session_id, "sleep"))
        await agent.client.wait_for("the sleep", lambda: bool(agent.client.of_kind("tool_call")))
        await agent.conn.cancel(session_id=session.session_id)
        response = await prompt
        assert response.stop_reason == "cancelled", agent.log()
        (record,) = _records()
        assert record.status == "cancelled" and record.completed_at is not None
        assert agent.client.of_kind("tool_call")[0]["kind"] == "execute"
        _assert_nothing_left()
        # The session goes on after a cancel, from the cancelled run's conversation.
        after = await _prompt(agent, session.session_id, "are you awake?")
    assert after.stop_reason == "end_turn", agent.log()
    assert agent.client.text().endswith("Woke up.")
    cancelled, then = _records()
    assert then.status == "success" and then.parent_session_id == cancelled.id


@pytest.mark.e2e
async def test_closed_stdin_mid_run_cancels_it_and_the_agent_exits(make_butler, tmp_path) -> None:
    roster = _butler(make_butler)
    async with agent_process(tmp_path, *_args(roster, _scenario(tmp_path, SLOW_TOOL))) as agent:
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        prompt = asyncio.create_task(_prompt(agent, session.session_id, "sleep"))
        await agent.client.wait_for("the sleep", lambda: bool(agent.client.of_kind("tool_call")))
        assert agent.process.stdin is not None
        agent.process.stdin.close()  # the client goes away without a word
        code = await asyncio.wait_for(agent.process.wait(), 90)
        prompt.cancel()
        await asyncio.gather(prompt, return_exceptions=True)
    assert code == 0, agent.log()
    assert "Traceback" not in agent.log()
    (record,) = _records()
    assert record.status == "cancelled"
    _assert_nothing_left()


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("limits", "reason", "says"),
    [
        ("[butler.limits]\nmax_tokens = 50", "max_tokens", "max_tokens = 50"),
        ("[butler.runtime]\nmax_turns = 1", "max_turn_requests", "max_turns"),
    ],
)
async def test_a_run_stopped_by_its_limits_says_so(
    make_butler, tmp_path, limits: str, reason: str, says: str
) -> None:
    butler = make_butler(extra=limits)
    scenario = _scenario(tmp_path, CONVERSATION)
    async with agent_process(tmp_path, *_args(Path(butler.roster_dir), scenario)) as agent:
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        response = await _prompt(agent, session.session_id, "go")
    assert response.stop_reason == reason, agent.log()
    assert says in agent.client.text()
    (record,) = _records()
    assert record.status in ("budget", "failed") and record.completed_at is not None
    _assert_nothing_left()


ASKED_WRITES = """
[[turn]]
tool = "Write"
input = { file_path = "/tmp/acp-asked.txt", content = "approved text" }
[[turn]]
text = "The write said: {{ last_tool_result }}"
[[turn]]
tool = "Write"
input = { file_path = "/tmp/acp-asked.txt", content = "again" }
[[turn]]
text = "Again: {{ last_tool_result }}"
"""


@pytest.mark.e2e
@pytest.mark.parametrize("answer", ["allow_once", "reject_once", "allow_always"])
async def test_an_ask_tool_asks_the_client_and_the_answer_is_kept(
    make_butler, tmp_path, answer: str
) -> None:
    butler = make_butler(
        extra='[butler.runtime]\ntools = ["Bash"]\n[butler.permissions]\nask = ["Write"]\n'
    )
    client = RecordingClient(answer=answer)
    scenario = _scenario(tmp_path, ASKED_WRITES)
    args = _args(Path(butler.roster_dir), scenario)
    async with agent_process(tmp_path, *args, client=client) as agent:
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        first = await _prompt(agent, session.session_id, "write the note")
        second = await _prompt(agent, session.session_id, "once more")
    assert (first.stop_reason, second.stop_reason) == ("end_turn", "end_turn"), agent.log()
    allowed = answer.startswith("allow")
    # Asked before each Write, with the call shown; "always" is not asked again.
    assert len(client.asked) == (1 if answer == "allow_always" else 2)
    shown = client.asked[0]
    assert shown["session"] == session.session_id
    assert (shown["tool_call"]["title"], shown["tool_call"]["kind"]) == (
        "Write /tmp/acp-asked.txt", "edit",
    )  # fmt: skip
    assert shown["options"] == ["allow_once", "allow_always", "reject_once", "reject_always"]
    writes = [u for u in client.of_kind("tool_call_update") if u["kind"] == "edit"]
    assert [u["status"] for u in writes] == ["completed" if allowed else "failed"] * 2
    # Each run's record keeps the answer, given by the ACP client.
    for record in _records():
        (kept,) = record.permissions
        assert (kept.tool, kept.allowed, kept.by) == ("Write", allowed, "acp-client")
    if not allowed:
        assert "rejected Write" in client.text()
    _assert_nothing_left()


async def test_a_refused_prompt_says_why_and_leaves_no_record(make_butler, tmp_path) -> None:
    butler = make_butler(extra='[butler.env]\nrequired = ["SPAWNKIT_ACP_MISSING"]\n')
    scenario = _scenario(tmp_path, CONVERSATION)
    async with agent_process(tmp_path, *_args(Path(butler.roster_dir), scenario)) as agent:
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        response = await _prompt(agent, session.session_id, "hello")
    assert response.stop_reason == "end_turn"
    assert response.field_meta == {"spawnkit": {"sessionId": None, "status": "refused"}}
    assert "SPAWNKIT_ACP_MISSING" in agent.client.text()
    assert _records() == []


@pytest.mark.e2e
async def test_initialize_does_not_wait_for_the_service_a_prompt_does(
    make_butler, tmp_path
) -> None:
    """The service cannot start until its scenario is written (a FIFO blocks its reader):
    initialize and session/new are answered meanwhile, and the prompt waits and runs."""
    roster = _butler(make_butler)
    scenario = tmp_path / "scenario.toml"
    os.mkfifo(scenario)
    async with agent_process(tmp_path, *_args(roster, scenario)) as agent:  # initialized
        assert agent.client.incoming[0]["result"]["agentInfo"]["name"] == "spawnkit"
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        prompt = asyncio.create_task(_prompt(agent, session.session_id, "how much do I weigh?"))
        # Blocks until the service's start opens the FIFO to read it.
        await asyncio.wait_for(asyncio.to_thread(scenario.write_text, CONVERSATION), 120)
        response = await prompt
    assert response.stop_reason == "end_turn", agent.log()
    assert agent.client.text() == "Looking it up.Writing a note.First answer."
    (record,) = _records()
    assert record.id == session.session_id and record.status == "success"
    _assert_nothing_left()


async def test_a_service_that_cannot_start_is_an_error_on_the_request_needing_it(
    make_butler, tmp_path
) -> None:
    roster = _butler(make_butler)
    scenario = _scenario(tmp_path, "[[turn]\nnot toml")
    async with agent_process(tmp_path, *_args(roster, scenario)) as agent:  # initialized

        async def new_session_and_prompt() -> None:
            # session/new fails when the start has already failed; else the prompt does.
            session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            await _prompt(agent, session.session_id, "hello")

        with pytest.raises(RequestError) as failed:
            await new_session_and_prompt()
        assert failed.value.code == -32603
        details = str(failed.value.data)
        assert "butler health could not start" in details and "not valid TOML" in details
        # Still answering what needs no service: the store.
        with pytest.raises(RequestError) as missing:
            await agent.conn.load_session(cwd="/", session_id="nope", mcp_servers=[])
        assert "no session nope" in str(missing.value.data)
    assert agent.process.returncode == 0, agent.log()
    assert "butler health could not start" in agent.log()  # the agent's log says why too
    assert _records() == []
    _assert_nothing_left()


@pytest.mark.e2e
async def test_bad_input_gets_json_rpc_errors_and_the_agent_carries_on(
    make_butler, tmp_path
) -> None:
    roster = _butler(make_butler)
    async with agent_process(tmp_path, *_args(roster, _scenario(tmp_path, CONVERSATION))) as agent:
        await agent.send_raw(b"{this is not json\n")
        parse = await agent.response_to(None)
        assert parse["error"]["code"] == -32700
        await agent.send_raw(b'[1, 2]\n{"jsonrpc": "2.0", "id": 7}\n')
        invalid = await agent.response_to(7)
        assert invalid["error"]["code"] == -32600
        await agent.send_raw(b'{"jsonrpc": "2.0", "id": "u1", "method": "session/dance"}\n')
        assert (await agent.response_to("u1"))["error"]["code"] == -32601
        with pytest.raises(RequestError) as unknown:
            await agent.conn.prompt(session_id="no-such-session", prompt=[text_block("hi")])
        assert unknown.value.code == -32602 and "unknown session" in str(unknown.value.data)
        with pytest.raises(RequestError) as missing:
            await agent.conn.load_session(cwd="/", session_id="nope", mcp_servers=[])
        assert "no session nope" in str(missing.value.data)
        # Still serving: a real prompt works after all that.
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        response = await _prompt(agent, session.session_id, "hello")
        assert response.stop_reason == "end_turn"
    assert len(_records()) == 1  # the refused requests left no record
    _assert_nothing_left()


@pytest.mark.e2e
@pytest.mark.skipif(
    not (REPO / "node_modules" / ".bin" / "codex").exists(),
    reason="the node CLIs are not installed (npm ci)",
)
async def test_codex_butler_streams_its_mcp_call(make_butler, tmp_path) -> None:
    roster = _butler(make_butler, runtime="codex", tools="[]")
    scenario = _scenario(
        tmp_path,
        '[[turn]]\ntext = "Looking."\ntool = "mcp__*__state_get"\ninput = { key = "w" }\n'
        '[[turn]]\ntext = "Nothing stored."\n',
    )
    async with agent_process(tmp_path, *_args(roster, scenario)) as agent:
        session = await agent.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        response = await _prompt(agent, session.session_id, "what do I weigh?")
    client = agent.client
    assert response.stop_reason == "end_turn", agent.log()
    (start,) = client.of_kind("tool_call")
    (done,) = client.of_kind("tool_call_update")
    assert (start["title"], start["kind"], done["status"]) == (
        "health.state_get", "other", "completed",
    )  # fmt: skip
    assert client.text().endswith("Nothing stored.\n\n")
    (record,) = _records()
    assert record.runtime == "codex" and record.status == "success"
    _assert_nothing_left()


async def test_an_unknown_butler_is_a_one_line_error(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "spawnkit", "acp", "--butler", "nobody",
        "--roster", str(REPO / "roster"),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2 and out == b""
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spawnkit: error:") and "nobody" in lines[0]


def test_the_protocol_side_loads_without_the_service() -> None:
    """What answers ``initialize`` loads without the butler's service (the MCP server, the
    runtimes: seconds of imports), which loads in a thread as the service starts."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, spawnkit.serve.acp.agent, spawnkit.cli.acp\n"
         "print(sorted(m for m in ('spawnkit.serve.service', 'mcp', 'claude_agent_sdk')"
         " if m in sys.modules))"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "[]"


@pytest.mark.e2e
def test_the_benchmark_runs(tmp_path: Path) -> None:
    import json

    out = tmp_path / "acp.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "acp_agent.py"), "--rounds", "1",
         "--no-warm-up", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["rounds"] == 1 and report["run_median_s"] > 0 and report["acp_median_s"] > 0
    assert report["ratio"] == pytest.approx(
        report["acp_median_s"] / report["run_median_s"], abs=0.002
    )
    assert 0 < report["acp_prompt_median_s"] < report["acp_median_s"]


@pytest.mark.parametrize("stdin", ["a file", "/dev/null"])
def test_stdio_that_is_a_file_or_dev_null_works_as_a_pipe_does(
    make_butler, tmp_path: Path, stdin: str
) -> None:
    """A person runs `spawnkit acp < requests.json > answers.json` (or `< /dev/null`): asyncio's
    pipe transports refuse files and epoll cannot watch /dev/null, which was a traceback."""
    roster = _butler(make_butler)
    requests = tmp_path / "requests.json"
    requests.write_text(
        '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    )
    answers = tmp_path / "answers.json"
    with (
        open(requests if stdin == "a file" else os.devnull, "rb") as source,
        open(answers, "wb") as sink,
    ):
        command = [sys.executable, "-m", "spawnkit", "acp", "--butler", "health"]
        done = subprocess.run(
            [*command, "--roster", str(roster)],
            stdin=source, stdout=sink, stderr=subprocess.PIPE, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    if stdin == "a file":
        (line,) = answers.read_text().splitlines()
        assert json.loads(line)["result"]["protocolVersion"] == 1
    else:
        assert answers.read_text() == ""
