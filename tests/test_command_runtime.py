"""The ``command`` runtime, the parsers it shares with the built-in runtimes, the sandbox of asks.

The CLIs here are small real programs written by the tests (Python scripts), run by the
spawner like any runtime: one reads its prompt file and prints JSON lines mapped by the
butler's ``[butler.runtime.events]``, one prints plain text. The sandbox test asks about
one of two registered sources and checks, from inside the run, what the agent can see.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from spawnkit.ask import BUILTIN_AGENTS, AgentCommand, ask, runtime_config
from spawnkit.config.roster import CommandConfig, RuntimeConfig
from spawnkit.containment.sources import SourceRegistry
from spawnkit.errors import RosterError
from spawnkit.events import RunEvent, TextDelta, ToolCallFinished
from spawnkit.result import SpawnerResult
from spawnkit.run import Spawner
from spawnkit.runtimes.base import RunSpec
from spawnkit.runtimes.claude_code import ClaudeStreamParser
from spawnkit.runtimes.command import TextParser, detect_output
from spawnkit.store import SessionStore
from tests.conftest import REPO, RosterFactory, processes_with_env

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


# Reads its prompt (from the file argv names, else stdin), says where it runs, then waits
# until the test has looked at the run's processes and files (a `go` file in its
# workspace, which the test writes at the same path: the workspace is bound at its own).
WAITING_AGENT = """
import hashlib, os, sys, time
workspace, *prompt_file = sys.argv[1:]
prompt = open(prompt_file[0]).read() if prompt_file else sys.stdin.read()
print("ready", workspace, prompt_file[0] if prompt_file else "-", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(workspace, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
print(f"chars={len(prompt)} sha256={hashlib.sha256(prompt.encode()).hexdigest()}")
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


# -- the prompt stays off the command line ------------------------------------------------

BIG_PROMPT_CHARS = 200_000  # over Linux's 128 KiB bound on one argument


def big_prompt(canary: str) -> str:
    body = ("all work and no play " * 10_000)[: BIG_PROMPT_CHARS - 2 * len(canary) - 2]
    return f"{canary}\n{body}\n{canary}"


def waiting_butler(make_butler: RosterFactory, tmp_path: Path, name: str, how: str) -> Any:
    agent = write(tmp_path / "waiting_agent.py", WAITING_AGENT)
    argv = [sys.executable, str(agent), "{workspace}"]
    if how == "prompt_file":
        argv.append("{prompt_file}")
    return make_butler(
        name,
        extra=f"""
        [butler.runtime]
        type = "command"
        command = {json.dumps(argv)}
        stdin = "{"prompt" if how == "stdin" else "none"}"
        """,
    )


def cmdlines() -> dict[int, bytes]:
    """Every live process's command line (/proc/PID/cmdline), by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return found


def read_as_nobody(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         "/usr/bin/python3", "-c", "import sys; print(open(sys.argv[1]).read()[:40])", path],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, cwd="/",
    )  # fmt: skip


def look(session: str, workspace: Path, prompt_file: str) -> dict[str, Any]:
    """What a run shows while it waits: its processes, every command line, and (when it
    reads a prompt file) that file's and its workspace's modes and what nobody can read."""
    seen: dict[str, Any] = {
        "workspace": workspace,
        "prompt_file": prompt_file,
        "run_pids": processes_with_env("SPAWNKIT_SESSION_ID", session),
        "cmdlines": cmdlines(),
    }
    if prompt_file != "-":
        seen["file_mode"] = stat.S_IMODE(Path(prompt_file).stat().st_mode)
        seen["workspace_mode"] = stat.S_IMODE(workspace.stat().st_mode)
        if os.geteuid() == 0 and shutil.which("setpriv"):
            seen["nobody"] = read_as_nobody(prompt_file)
    return seen


async def run_and_look(
    butler: Any, store: SessionStore, prompt: str
) -> tuple[SpawnerResult, dict[str, Any]]:
    """Trigger a run of the waiting agent; while it waits, :func:`look` at it; then let it
    finish. Returns the result and what was seen."""
    ready: asyncio.Future[TextDelta] = asyncio.get_running_loop().create_future()

    def on_event(event: RunEvent) -> None:
        if isinstance(event, TextDelta) and event.text.startswith("ready ") and not ready.done():
            ready.set_result(event)

    run = asyncio.create_task(Spawner(butler, store=store).trigger(prompt, on_event=on_event))
    workspace: Path | None = None
    try:
        async with asyncio.timeout(120):
            said = await ready
        _, where, prompt_file = said.text.split()
        workspace = Path(where)
        seen = look(said.session_id, workspace, prompt_file)
    finally:
        if workspace is not None:
            (workspace / "go").touch()
        async with asyncio.timeout(120):
            result = await run
    return result, seen


def digest_line(prompt: str) -> str:
    return f"chars={len(prompt)} sha256={hashlib.sha256(prompt.encode()).hexdigest()}"


async def test_a_200_kb_prompt_through_prompt_file_never_shows_on_a_command_line(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    canary = f"PROMPT-CANARY-{uuid.uuid4().hex}"
    prompt = big_prompt(canary)
    butler = waiting_butler(make_butler, tmp_path, "filed", "prompt_file")

    with caplog.at_level(logging.WARNING, logger="spawnkit"):
        result, seen = await run_and_look(butler, store, prompt)

    assert result.success, result.error
    assert result.output.splitlines()[-1] == digest_line(prompt)  # the whole prompt, intact
    # The path the agent was given is the path on the host: the workspace is bound at its own.
    assert Path(seen["prompt_file"]).parent == seen["workspace"]
    assert (seen["file_mode"], seen["workspace_mode"]) == (0o600, 0o700)
    run_pids = seen["run_pids"]
    assert any(b"waiting_agent.py" in seen["cmdlines"].get(pid, b"") for pid in run_pids), (
        "the agent itself was among the processes looked at"
    )
    leaking = [pid for pid, line in seen["cmdlines"].items() if canary.encode() in line]
    assert leaking == [], "the prompt is on no command line of the run, nor any other"
    assert not [r for r in caplog.records if "{prompt}" in r.getMessage()]


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
    reason="needs root (to act as the user nobody), setpriv and /usr/bin/python3",
)
async def test_another_local_user_cannot_read_the_prompt_file(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path
) -> None:
    canary = f"PROMPT-CANARY-{uuid.uuid4().hex}"
    butler = waiting_butler(make_butler, tmp_path, "private", "prompt_file")

    result, seen = await run_and_look(butler, store, f"{canary} what now?")

    assert result.success, result.error
    nobody = seen["nobody"]
    assert nobody.returncode != 0 and "PermissionError" in nobody.stderr, nobody
    assert canary not in nobody.stdout


async def test_a_200_kb_prompt_on_stdin_arrives_intact(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path
) -> None:
    canary = f"PROMPT-CANARY-{uuid.uuid4().hex}"
    prompt = big_prompt(canary)
    butler = waiting_butler(make_butler, tmp_path, "piped", "stdin")

    result, seen = await run_and_look(butler, store, prompt)

    assert result.success, result.error
    assert result.output.splitlines()[-1] == digest_line(prompt)
    assert seen["run_pids"]
    assert [pid for pid, line in seen["cmdlines"].items() if canary.encode() in line] == []


async def test_prompt_on_the_command_line_warns_naming_the_fix(
    make_butler: RosterFactory, store: SessionStore, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    agent = write(tmp_path / "echo_agent.py", "import sys\nprint('got', sys.argv[1])\n")
    butler = make_butler(
        "leaky",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = [{json.dumps(sys.executable)}, {json.dumps(str(agent))}, "{{prompt}}"]
        """,
    )

    with caplog.at_level(logging.WARNING, logger="spawnkit"):
        result = await Spawner(butler, store=store).trigger("short and public")

    assert result.success and result.output == "got short and public", result.error
    (warning,) = [r.getMessage() for r in caplog.records if "{prompt}" in r.getMessage()]
    for fragment in ("'leaky'", result.session_id, "/proc/PID/cmdline", "{prompt_file}",
                     'stdin = "prompt"'):  # fmt: skip
        assert fragment in warning, (fragment, warning)


def test_the_roster_check_warns_of_prompt_on_the_command_line(
    make_butler: RosterFactory, tmp_path: Path
) -> None:
    agent = write(tmp_path / "echo_agent.py", "import sys\nprint('got', sys.argv[1])\n")
    butler = make_butler(
        "leaky",
        extra=f"""
        [butler.runtime]
        type = "command"
        command = [{json.dumps(sys.executable)}, {json.dumps(str(agent))}, "{{prompt_file}}"]
        resume_command = [{json.dumps(sys.executable)}, "{{resume}}", "{{prompt}}"]
        """,
    )
    make_butler(
        "tight", extra='[butler.runtime]\ntype = "command"\ncommand = ["x", "{prompt_file}"]\n'
    )

    # `spawnkit roster`, the check of a roster, says so (and still passes), once, for the
    # butler whose command lines pass {prompt}.
    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", "roster", "--roster", str(butler.roster_dir)],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"spawnkit: warning: {butler.config_file}: [butler.runtime] resume_command puts"
    ), line
    assert "{prompt_file}" in line and 'stdin = "prompt"' in line
