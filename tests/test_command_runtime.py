"""The ``command`` runtime, the parsers it shares with the built-in runtimes, the sandbox of asks.

The CLIs here are small real programs written by the tests (Python scripts), run by the
spawner like any runtime: one reads its prompt file and prints JSON lines mapped by the
butler's ``[butler.runtime.events]``, one prints plain text. The sandbox test asks about
one of two registered sources and checks, from inside the run, what the agent can see.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from spawnkit.ask import BUILTIN_AGENTS, AgentCommand, ask, runtime_config
from spawnkit.errors import RosterError
from spawnkit.events import RunEvent, ToolCallFinished
from spawnkit.roster import CommandConfig, RuntimeConfig
from spawnkit.runtimes.base import RunSpec
from spawnkit.runtimes.claude_code import ClaudeStreamParser
from spawnkit.runtimes.command import TextParser, detect_output
from spawnkit.sources import SourceRegistry
from spawnkit.spawner import Spawner
from spawnkit.store import SessionStore
from tests.conftest import RosterFactory

JSON_AGENT = """
import json, os, sys
prompt_file, system_file, mcp_config, workspace = sys.argv[1:5]
prompt = open(prompt_file).read()
system = open(system_file).read()
servers = sorted(json.load(open(mcp_config))["mcpServers"])
def say(**line):
    print(json.dumps(line), flush=True)
say(kind="hello", sid="agent-7")
say(kind="say", words="Reading the prompt.")
say(kind="call", call="c1", tool="read_prompt", args={"path": prompt_file})
say(kind="done", call="c1", result=prompt)
say(kind="noise", x=1)
answer = f"prompt={prompt!r} system_starts={system[:12]!r} servers={servers} "
answer += f"home_is_workspace={os.environ['HOME'] == workspace} token={os.environ['AGENT_TOKEN']}"
say(kind="final", answer=answer, tokens={"input_tokens": 11, "output_tokens": 5})
"""

TEXT_AGENT = """
import sys
print("plain answer to:", sys.stdin.read().strip())
print("second line")
"""


def write(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


async def test_a_json_lines_cli_as_a_butler_runtime(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path
) -> None:
    agent = write(tmp_path / "json_agent.py", JSON_AGENT)
    butler = make_butler(
        "jsonish",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = [{json.dumps(sys.executable)}, {json.dumps(str(agent))}, "{{prompt_file}}",
                   "{{system_prompt_file}}", "{{mcp_config}}", "{{workspace}}"]
        output = "json-lines"
        env = {{ AGENT_TOKEN = "tok-{{model}}" }}

        [butler.runtime.events]
        type_key = "kind"
        text = "say"
        text_field = "words"
        tool_call = "call"
        tool_result = "done"
        id_field = "call"
        name_field = "tool"
        input_field = "args"
        output_field = "result"
        result = "final"
        answer_field = "answer"
        usage_field = "tokens"
        session_field = "sid"
        """,
        prompt="You are the jsonish butler.",
    )
    events: list[RunEvent] = []
    spawner = Spawner(butler, store=store, model="m1")

    result = await spawner.trigger("Count the apples", on_event=events.append)

    assert result.success, result.error
    assert "prompt='Count the apples'" in result.output
    assert "system_starts='You are the '" in result.output
    assert "servers=['jsonish']" in result.output  # {mcp_config}: the butler's server
    assert "home_is_workspace=True token=tok-m1" in result.output
    assert result.runtime_session_id == "agent-7"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (11, 5)
    (call,) = result.tool_calls
    assert (call.name, call.input, call.output, call.status) == (
        "read_prompt", {"path": call.input["path"]}, "Count the apples", "ok",
    )  # fmt: skip
    assert any(isinstance(e, ToolCallFinished) for e in events)
    record = store.get_session(result.session_id or "")
    assert record is not None and (record.runtime, record.kind, record.status) == (
        "command", "run", "success",
    )  # fmt: skip


async def test_a_plain_text_cli_reading_stdin(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path
) -> None:
    agent = write(tmp_path / "text_agent.py", TEXT_AGENT)
    butler = make_butler(
        "plain",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = [{json.dumps(sys.executable)}, {json.dumps(str(agent))}]
        stdin = "prompt"
        """,
    )

    result = await Spawner(butler, store=store).trigger("What now?")

    assert result.success, result.error
    assert result.output == "plain answer to: What now?\nsecond line"


async def test_a_failing_command_names_its_exit_code_and_stderr(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path
) -> None:
    agent = write(tmp_path / "bad.py", "import sys\nsys.exit('Error: no model configured')\n")
    butler = make_butler(
        "bad",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = [{json.dumps(sys.executable)}, {json.dumps(str(agent))}]
        """,
    )
    result = await Spawner(butler, store=store).trigger("hi")
    assert not result.success
    assert result.error == "exited with code 1: Error: no model configured"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('type = "command"\n', r"needs a command"),
        ('type = "command"\ncommand = ["x", "{promt_file}"]\n', r"unknown placeholder \{promt"),
        ('type = "command"\ncommand = ["x"]\noutput = "xml"\n', r"must be one of text, json-l"),
        ('type = "codex"\ncommand = ["x"]\n', r'only a runtime of type = "command" takes it'),
        ('type = "command"\ncommand = ["x"]\n[butler.runtime.events]\ntexts = "t"\n', "texts"),
    ],
)
def test_command_runtime_config_errors(
    make_butler: RosterFactory, extra: str, message: str
) -> None:
    with pytest.raises(RosterError, match=message):
        make_butler("broken", extra="[butler.runtime]\n" + extra)


def test_ask_toml_agents_become_runtimes() -> None:
    assert runtime_config(BUILTIN_AGENTS["codex"]) == RuntimeConfig(type="codex")
    mine = AgentCommand(
        name="mine", command=("mine", "{prompt_file}", "{workdir}"), output="text",
        env={"AT": "{workdir}/x"}, stdin="prompt",
    )  # fmt: skip
    converted = runtime_config(mine)
    assert converted.type == "command"
    assert converted.command == CommandConfig(
        argv=("mine", "{prompt_file}", "{cwd}"), output="text", stdin="prompt",
        env={"AT": "{cwd}/x"},
    )  # fmt: skip


# -- the sandbox of an ask ---------------------------------------------------------------

PROBE = """
import os, sys
notes, secret = os.environ["NOTES"], os.environ["SECRET"]
print("linked:", sorted(n for n in os.listdir(".") if os.path.islink(n)))
print("notes readable:", open("notes/todo.txt").read().strip())
print("notes real path readable:", os.path.exists(notes))
print("other source exists:", os.path.exists(secret))
try:
    open("notes/new.txt", "w").write("x")
    print("notes writable: True")
except OSError as exc:
    print("notes writable: False", exc.strerror)
"""


async def test_an_ask_sees_its_sources_read_only_and_no_other(
    tmp_path: Path, isolated_home: Path
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("buy oat milk\n")
    (tmp_path / "diary").mkdir()
    (tmp_path / "diary" / "secret.txt").write_text("private\n")
    registry = SourceRegistry()
    registry.add("notes", tmp_path / "notes")
    registry.add("diary", tmp_path / "diary")
    probe = write(tmp_path / "probe.py", PROBE)
    runtime = RuntimeConfig(
        type="command",
        # The paths go in the environment: a path in argv is bound into the sandbox.
        command=CommandConfig(
            argv=(sys.executable, str(probe)),
            env={"NOTES": str(tmp_path / "notes"), "SECRET": str(tmp_path / "diary")},
        ),
    )

    result = await ask(["notes"], "Look around", runtime=runtime, registry=registry)

    assert result.answer.splitlines() == [
        "linked: ['notes']",
        "notes readable: buy oat milk",
        "notes real path readable: True",
        "other source exists: False",
        "notes writable: False Read-only file system",
    ]
    assert not (tmp_path / "notes" / "new.txt").exists()


# -- the parsers, on recorded lines --------------------------------------------------------

CLAUDE_LINES = [
    '{"type":"system","subtype":"init","session_id":"s-1","model":"claude-x","tools":["Read"]}',
    '{"type":"stream_event","uuid":"u0","session_id":"s-1","event":{"type":"content_block_delta",'
    '"index":0,"delta":{"type":"text_delta","text":"Look"}},"parent_tool_use_id":null}',
    '{"type":"assistant","message":{"model":"claude-x","content":[{"type":"tool_use","id":"t1",'
    '"name":"Read","input":{"file_path":"notes/todo.txt"}}]},"parent_tool_use_id":null}',
    '{"type":"user","message":{"content":[{"tool_use_id":"t1","type":"tool_result",'
    '"content":"1\\tbuy milk"}]}}',
    '{"type":"assistant","message":{"model":"claude-x","content":[{"type":"text",'
    '"text":"Buy milk."}]},"parent_tool_use_id":null}',
    '{"type":"result","subtype":"success","is_error":false,"result":"Buy milk.",'
    '"session_id":"s-1","num_turns":2,"total_cost_usd":0.01,"duration_ms":5,'
    '"duration_api_ms":4,"usage":{"input_tokens":10,"output_tokens":3}}',
]


def _spec(tmp_path: Path) -> RunSpec:
    return RunSpec(
        session_id="ask-1", butler="ask", prompt="q", system_prompt="", workspace=tmp_path,
        cwd=tmp_path, mcp_server=None, config_file=tmp_path / "mcp.json", env={}, max_turns=5,
    )  # fmt: skip


def test_claude_stream_parser_is_the_adapters_own(tmp_path: Path) -> None:
    parser = ClaudeStreamParser(_spec(tmp_path))
    events = [event for line in CLAUDE_LINES for event in parser.feed(line)]

    kinds = [type(event).__name__ for event in events]
    assert kinds == [
        "UsageUpdate", "TextDelta", "ToolCallStarted", "ToolCallFinished", "AssistantText",
    ]  # fmt: skip
    finished = events[3]
    assert isinstance(finished, ToolCallFinished)
    assert (finished.call.name, finished.call.output, finished.call.status) == (
        "Read", "1\tbuy milk", "ok",
    )  # fmt: skip
    outcome = parser.outcome(0, [])
    assert (outcome.success, outcome.output, outcome.runtime_session_id) == (
        True, "Buy milk.", "s-1",
    )  # fmt: skip
    assert outcome.usage.input_tokens == 10 and parser.tool_calls == 1


def test_claude_stream_parser_failures(tmp_path: Path) -> None:
    parser = ClaudeStreamParser(_spec(tmp_path))
    parser.feed(
        '{"type":"result","subtype":"success","is_error":true,"result":"API Error: 400 nope",'
        '"session_id":"s","num_turns":1,"duration_ms":1,"duration_api_ms":1}'
    )
    failed = parser.outcome(1, [])
    assert not failed.success and failed.error is not None and "400 nope" in failed.error
    empty = ClaudeStreamParser(_spec(tmp_path)).outcome(1, ["", "Error: something broke", ""])
    assert (empty.success, empty.error) == (
        False, "Claude Code exited with code 1 without a result: Error: something broke",
    )  # fmt: skip


def test_text_parser_and_output_detection() -> None:
    parser = TextParser("ask-1")
    for line in ["", "The answer", "is 42.", ""]:
        parser.feed(line)
    assert parser.outcome(0, []).output == "The answer\nis 42."
    assert parser.outcome(2, ["bad", ""]).error == "exited with code 2: bad"
    assert parser.outcome(2, []).error == "exited with code 2"
    assert detect_output(CLAUDE_LINES[0]) == "claude-stream-json"
    assert detect_output('{"type":"thread.started","thread_id":"t"}') == "codex-json"
    assert detect_output('{"type":"init","session_id":"s","model":"m"}') == "gemini-stream-json"
    assert detect_output('{"type":"answer","text":"42"}') == "json-lines"
    assert detect_output('{"answer": 42}') == "text"
    assert detect_output("# Plain markdown") == "text"
    assert detect_output("[1, 2]") == "text"
