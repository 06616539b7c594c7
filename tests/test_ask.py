"""Ask mode: templates, agent command templates, and real runs through the Spawner.

The end-to-end tests run the real Claude Code CLI (bundled in claude-agent-sdk), Codex and
Gemini against the replay server: the scripted model calls the CLI's own Read/Grep/Glob/Bash
tools on the linked sources, and the answer must carry what the files say. Each ask is a
run of the spawner: its record (kind "ask", the sources), span and history row are checked.
Failing agents are small Python scripts configured as ``ask.toml`` agents, which become
``command`` runtimes. The terminal chat is driven through a pseudo-terminal (pexpect).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from pathlib import Path
from typing import Any

import claude_agent_sdk
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spawnkit.ask import (
    BUILTIN_AGENTS,
    DEFAULT_TEMPLATE,
    AgentCommand,
    AskConfig,
    AskConfigError,
    AskError,
    AskResult,
    TemplateError,
    ask,
    ask_sync,
    ask_turn,
    ensure_template,
    load_config,
    load_template,
    render_prompt,
    save_config,
    sources_list,
    template_path,
)
from spawnkit.containment.sources import Source, SourcePathError, SourceRegistry, UnknownSourceError
from spawnkit.errors import RuntimeNotFoundError, UnknownRuntimeError
from spawnkit.events import Finished, RunEvent, Started, TextDelta, ToolCallStarted
from spawnkit.history import sessions as history_sessions
from spawnkit.replay import ReplayServer, Scenario
from spawnkit.store import SessionRecord, SessionStore

from .conftest import processes_with_env

REPO = Path(__file__).resolve().parent.parent
CLAUDE = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
CODEX = REPO / "node_modules" / ".bin" / "codex"
GEMINI = REPO / "node_modules" / ".bin" / "gemini"
RUN_TIMEOUT_S = 60.0
KEYS = {"ANTHROPIC_API_KEY": "replay", "OPENAI_API_KEY": "replay", "GEMINI_API_KEY": "replay"}

needs_claude = pytest.mark.skipif(not CLAUDE.exists(), reason="the bundled claude CLI is missing")


# -- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp dir ask mode creates its working directories in, private to the test."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.setenv("TMPDIR", str(root))
    return root


def workdirs(root: Path) -> list[Path]:
    return sorted(root.glob("spawnkit-ask-*"))


def workspaces(home: Path) -> list[Path]:
    """The run workspaces left under ``$SPAWNKIT_HOME`` (an ask's is removed when it ends)."""
    return sorted((home / "workspaces").glob("*"))


def record_of(result: AskResult) -> SessionRecord:
    assert result.record_id is not None
    record = SessionStore().get_session(result.record_id)
    assert record is not None
    return record


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def check_recorded(
    result: AskResult, sources: list[str], exporter: InMemorySpanExporter | None = None
) -> None:
    """One record of kind "ask" naming the sources, its span, its history row."""
    record = record_of(result)
    assert (record.kind, record.sources, record.butler) == ("ask", tuple(sources), "ask")
    assert record.status == "success" and record.output == result.answer
    assert record.given is not None and record.given["mcp_servers"] == []
    assert len(record.given["sources"]) == len(sources)
    assert record.sandbox == "bwrap"
    frame = history_sessions(SessionStore())
    assert result.record_id in set(frame["session_id"])
    if exporter is not None:
        (span,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent ask"]
        assert span.attributes is not None
        assert span.attributes["spawnkit.kind"] == "ask"
        assert span.attributes["spawnkit.session_id"] == result.record_id


@pytest.fixture
def library(tmp_path: Path) -> Path:
    """Files outside the working directory that the sources point at."""
    lib = tmp_path / "library"
    (lib / "notes" / "deep").mkdir(parents=True)
    (lib / "notes" / "todo.txt").write_text("buy oat milk\nwater the fern\n")
    (lib / "notes" / "deep" / "recipe.md").write_text("# Pancakes\nflour, eggs, milk\n")
    (lib / "single.md").write_text("The meeting moved to Thursday 14:00.\n")
    return lib


@pytest.fixture
def registry(library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SourceRegistry:
    """notes (directory), single (file) and repo (a git clone of a local repository)."""
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "spawnkit tests")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "tests@spawnkit.invalid")
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    (upstream / "README.md").write_text("Release codename: BLUE HERON\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=upstream, check=True, timeout=30)
    registry = SourceRegistry(git_timeout_s=30)
    registry.add("notes", library / "notes")
    registry.add("single", library / "single.md")
    registry.add("repo", upstream, kind="git")
    return registry


def write_script(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def user_agents(isolated_home: Path, agents: dict[str, dict[str, Any]], default: str) -> None:
    import tomli_w

    (isolated_home / "ask.toml").write_text(
        tomli_w.dumps({"ask": {"default": default, "agents": agents}})
    )


def scenario(text: str) -> ReplayServer:
    return ReplayServer(Scenario.from_dict(tomllib.loads(text), source="ask-test.toml"))


# -- the prompt template ----------------------------------------------------------------


def test_template_is_created_from_the_bundled_default(isolated_home: Path) -> None:
    path = template_path()
    assert path == isolated_home / "prompt_template.md"
    assert not path.exists()

    assert ensure_template() == path

    text = path.read_text()
    assert text == DEFAULT_TEMPLATE.read_text()
    assert "# Question\n\n${question}" in text
    assert "# Available Sources\n\n${sourcesList}" in text
    assert "Grep" in text and "Glob" in text  # how to search with the agent's tools


def test_user_additions_to_the_template_are_kept(isolated_home: Path) -> None:
    ensure_template()
    path = template_path()
    custom = path.read_text() + "\nAlways answer in French. Budget: $5 per ${unit}.\n"
    path.write_text(custom)

    ensure_template()  # a second call never overwrites

    assert path.read_text() == custom
    prompt = render_prompt(load_template(), "Où est le lait ?", ["notes"])
    assert prompt.endswith("Always answer in French. Budget: $5 per ${unit}.\n")
    assert "Où est le lait ?" in prompt


def test_only_the_two_placeholders_are_substituted() -> None:
    template = (
        "Q: ${question}\nS:\n${sourcesList}\n"
        "Keep $HOME, $question, ${other}, $$, ${ question }, $5 and ${sourcesList}!"
    )
    question = "Is ${sourcesList} expanded inside a question? $PATH"

    prompt = render_prompt(template, question, ["a", "b"])

    assert prompt == (
        "Q: Is ${sourcesList} expanded inside a question? $PATH\nS:\n- ./a/\n- ./b/\n"
        "Keep $HOME, $question, ${other}, $$, ${ question }, $5 and - ./a/\n- ./b/!"
    )


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "Sources: ${sourcesList}",
            "Invalid prompt template: missing required placeholder ${question}",
        ),
        (
            "Question: ${question} $sourcesList {sourcesList}",
            "Invalid prompt template: missing required placeholder ${sourcesList}",
        ),
        (
            "Nothing here but $question",
            "Invalid prompt template: missing required placeholder ${question}; "
            "missing required placeholder ${sourcesList}",
        ),
    ],
)
def test_template_validation_messages(template: str, message: str) -> None:
    with pytest.raises(TemplateError) as info:
        render_prompt(template, "q", ["a"])
    assert str(info.value) == message


def test_a_broken_user_template_fails_before_anything_runs(
    isolated_home: Path, registry: SourceRegistry, tmp_root: Path
) -> None:
    template_path().write_text("Just ${question}, no sources.\n")

    with pytest.raises(TemplateError, match=r"placeholder \$\{sourcesList\}$") as info:
        ask_sync(["notes"], "anything", registry=registry)

    assert info.value.path == template_path()
    assert workdirs(tmp_root) == []


def test_sources_list_lines() -> None:
    when = Source("x", "directory", Path("/x"), added_at=time_zero())
    as_file = Source("f", "file", Path("/f.md"), added_at=time_zero())
    assert sources_list(["notes", "repo"]) == "- ./notes/\n- ./repo/"
    assert sources_list([when, as_file]) == "- ./x/\n- ./f"


def time_zero() -> Any:
    from datetime import UTC, datetime

    return datetime(2026, 1, 1, tzinfo=UTC)


# -- agent command templates ------------------------------------------------------------


def test_builtin_agents_without_a_config_file(isolated_home: Path) -> None:
    config = load_config()
    assert config.default == "claude-code"
    assert set(config.agents) == {"claude-code", "codex", "gemini"}
    assert config.agent() is config.agents["claude-code"]
    with pytest.raises(UnknownRuntimeError, match=r"runtimes: claude-code \(or claude\), codex"):
        config.agent("nope")


def test_user_agents_and_changes_to_a_builtin(isolated_home: Path) -> None:
    user_agents(
        isolated_home,
        {
            "mine": {"command": ["my-agent", "--file", "{prompt_file}"], "output": "text"},
            "claude-code": {"pass_env": ["ANTHROPIC_API_KEY", "MY_PROXY_TOKEN"]},
        },
        default="mine",
    )

    config = load_config()

    assert config.default == "mine"
    mine = config.agent()
    assert (mine.command, mine.output, mine.stdin, mine.setup) == (
        ("my-agent", "--file", "{prompt_file}"), "text", "none", "none",
    )  # fmt: skip
    assert mine.chat_command == ()
    claude = config.agent("claude-code")
    assert claude.pass_env == ("ANTHROPIC_API_KEY", "MY_PROXY_TOKEN")
    assert claude.command == BUILTIN_AGENTS["claude-code"].command  # the rest is kept


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"command": ["x"], "colour": "red"}, r"\[ask\.agents\.bad\]: unknown keys colour"),
        ({"command": ["x", "{prompt_fil}"]}, r"unknown placeholder \{prompt_fil\}"),
        ({"command": ["x"], "chat_command": ["x", "{prompt}"]}, r"chat_command: unknown place"),
        ({"command": ["x", "{resume}"]}, r"command: unknown placeholder \{resume\}"),
        ({"command": ["x"], "output": "xml"}, "output must be one of auto, claude-stream-json"),
        ({"command": ["x"], "stdin": "file"}, "stdin must be one of prompt, none"),
        ({"command": "x --y"}, "command must be a list of strings"),
        ({"output": "text"}, "command is required"),
        ({"command": ["x"], "env": {"A": "{prompt}"}}, r"env: unknown placeholder \{prompt\}"),
    ],
)
def test_config_errors_name_the_key(
    isolated_home: Path, table: dict[str, Any], message: str
) -> None:
    user_agents(isolated_home, {"bad": table}, default="claude-code")
    with pytest.raises(AskConfigError, match=message) as info:
        load_config()
    assert str(isolated_home / "ask.toml") in str(info.value)


def test_config_default_must_exist(isolated_home: Path) -> None:
    (isolated_home / "ask.toml").write_text('[ask]\ndefault = "ghost"\n')
    with pytest.raises(AskConfigError, match="default 'ghost' is not an agent"):
        load_config()


def test_save_config_round_trip(isolated_home: Path) -> None:
    mine = AgentCommand(name="mine", command=("mine", "{{literal}}", "{prompt}"), output="text")
    config = AskConfig(agents={**BUILTIN_AGENTS, "mine": mine}, default="mine", timeout_s=42)

    path = save_config(config, isolated_home / "ask.toml")

    loaded = load_config(path)
    assert loaded.agent() == mine
    assert loaded.timeout_s == 42
    assert "claude-code" not in tomllib.loads(path.read_text())["ask"].get("agents", {})


def test_a_missing_cli_fails_before_a_directory_exists(
    registry: SourceRegistry,
    tmp_root: Path,
    isolated_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPAWNKIT_CODEX_CLI", str(tmp_root / "no-codex"))
    with pytest.raises(RuntimeNotFoundError, match="codex"):
        ask_sync(["notes"], "q", runtime="codex", registry=registry)
    assert workspaces(isolated_home) == []
    assert SessionStore().list_sessions() == []


# -- end to end: the real Claude Code CLI against the replay server ----------------------

DIRECTORY_SCENARIO = """
[[turn]]
tool = "Grep"
input = { pattern = "milk", path = "notes", output_mode = "content" }
[[turn]]
tool = "Glob"
input = { pattern = "**/*.md", path = "notes" }
[[turn]]
tool = "Read"
input = { file_path = "notes/todo.txt" }
[[turn]]
text = "From your notes: {{ last_tool_result }}"
"""

FILE_SCENARIO = """
[[turn]]
shell = "cat ./single; cat .mcp.json .gemini/settings.json .cursor/mcp.json opencode.json"
[[turn]]
text = "{{ last_tool_result }}"
"""

GIT_SCENARIO = """
[[turn]]
tool = "Read"
input = { file_path = "repo/README.md" }
[[turn]]
text = "The repository says: {{ last_tool_result }}"
"""


@pytest.mark.e2e
@needs_claude
@pytest.mark.parametrize(
    ("source", "script", "expected_tools", "expected"),
    [
        (
            "notes",
            DIRECTORY_SCENARIO,
            ["Grep", "Glob", "Read"],
            ["From your notes:", "buy oat milk"],
        ),
        ("single", FILE_SCENARIO, ["Bash"], ["Thursday 14:00", '"mcpServers": {}', '"mcp": {}']),
        ("repo", GIT_SCENARIO, ["Read"], ["The repository says:", "BLUE HERON"]),
    ],
    ids=["directory", "file", "git"],
)
async def test_ask_reads_each_kind_of_source(
    registry: SourceRegistry,
    isolated_home: Path,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    source: str,
    script: str,
    expected_tools: list[str],
    expected: list[str],
) -> None:
    server = scenario(script)
    events: list[RunEvent] = []
    provider, exporter = spans
    async with server.serve() as url:
        result = await ask(
            [source], "What do my sources say?", base_url=url, env=KEYS,
            registry=registry, timeout_s=RUN_TIMEOUT_S, on_event=events.append,
            tracer_provider=provider,
        )  # fmt: skip

    assert isinstance(result, AskResult)
    for fragment in expected:
        assert fragment in result.answer
    assert result.runtime == "claude-code"
    assert [call.name for call in result.tool_calls] == expected_tools
    assert all(call.status == "ok" for call in result.tool_calls)
    if source == "notes":  # Glob followed the link: the recipe deep inside was found
        assert "recipe.md" in result.tool_calls[1].output
    assert result.session_id and result.exit_code == 0 and result.sources == (source,)
    assert result.duration_s < RUN_TIMEOUT_S
    assert not result.workdir.exists()
    assert workspaces(isolated_home) == []
    assert any(isinstance(e, ToolCallStarted) for e in events)
    assert any(isinstance(e, TextDelta) for e in events)
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    check_recorded(result, [source], exporter)
    # The model saw the rendered template: the question and the source list.
    first = json.dumps(server.requests[-1].body["messages"][0])
    assert "What do my sources say?" in first
    assert f"- ./{source}" in first


@pytest.mark.e2e
@needs_claude
async def test_ask_over_several_sources_in_one_run(
    registry: SourceRegistry, isolated_home: Path
) -> None:
    server = scenario(
        """
        [[turn]]
        shell = "pwd; ls; cat ./notes/deep/recipe.md ./single ./repo/README.md"
        [[turn]]
        text = "{{ last_tool_result }}"
        """.replace("\n        ", "\n")
    )
    async with server.serve() as url:
        result = await ask(
            "notes,single,repo", "Everything?", base_url=url, env=KEYS, registry=registry,
            timeout_s=RUN_TIMEOUT_S,
        )  # fmt: skip

    cwd, *rest = result.answer.splitlines()
    assert Path(cwd) == result.workdir and cwd.startswith(str(isolated_home / "workspaces"))
    assert rest[:4] == ["notes", "opencode.json", "repo", "single"]
    for fragment in ("flour, eggs, milk", "Thursday 14:00", "BLUE HERON"):
        assert fragment in result.answer
    assert workspaces(isolated_home) == []
    check_recorded(result, ["notes", "single", "repo"])


@pytest.mark.e2e
@needs_claude
async def test_a_failing_model_raises_and_removes_the_workdir(
    registry: SourceRegistry, isolated_home: Path
) -> None:
    server = scenario(
        '[[turn]]\nerror = { status = 400, type = "invalid_request_error", '
        'message = "Replayed refusal" }\n'
    )
    async with server.serve() as url:
        with pytest.raises(AskError) as info:
            await ask(
                ["notes"], "q", base_url=url, env=KEYS, registry=registry,
                timeout_s=RUN_TIMEOUT_S,
            )  # fmt: skip

    error = info.value
    assert error.runtime == "claude-code"
    assert "Replayed refusal" in str(error)
    assert error.workdir is not None and not error.workdir.exists()
    assert workspaces(isolated_home) == []
    record = SessionStore().get_session(error.record_id or "")
    assert record is not None and (record.kind, record.status) == ("ask", "failed")
    assert record.error is not None and "Replayed refusal" in record.error


@pytest.mark.e2e
@needs_claude
async def test_ask_turn_resumes_the_session(registry: SourceRegistry, isolated_home: Path) -> None:
    server = scenario(
        """
        [[turn]]
        shell = "cat ./single"
        [[turn]]
        text = "First: {{ last_tool_result }}"
        [[turn]]
        text = "Second, about: {{ prompt }}"
        """.replace("\n        ", "\n")
    )
    async with server.serve() as url:
        first = await ask_turn(
            ["single"], "When is the meeting?", base_url=url, env=KEYS, registry=registry
        )
        second = await ask_turn(
            ["single"], "And who comes?", resume=first.record_id, base_url=url, env=KEYS,
            registry=registry,
        )  # fmt: skip

    assert first.answer == "First: The meeting moved to Thursday 14:00."
    # The third scripted turn played: the model got the first two turns back as history.
    assert second.answer == "Second, about: When is the meeting?"
    last = json.dumps(server.requests[-1].body["messages"])
    assert "And who comes?" in last and "First: The meeting moved" in last
    assert second.session_id == first.session_id
    assert record_of(second).parent_session_id == first.record_id
    assert record_of(second).kind == "ask" and record_of(second).sources == ("single",)
    assert workspaces(isolated_home) == []


# -- end to end: user command templates -------------------------------------------------


def test_a_plain_text_agent_answers_on_stdout(
    isolated_home: Path, registry: SourceRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = write_script(
        tmp_path / "plain_agent.py",
        """
        import os, sys
        prompt = open(sys.argv[1]).read()
        question = prompt.split("# Question")[1].split("#")[0].strip()
        print(f"You asked: {question}")
        print(f"Todo says: {open('notes/todo.txt').readline().strip()}")
        # What the process was started with (Python may add LC_CTYPE to os.environ).
        names = open("/proc/self/environ", "rb").read().split(b"\\0")
        print(f"Environment: {sorted(n.split(b'=')[0].decode() for n in names if n)}")
        """,
    )
    user_agents(
        isolated_home,
        {"plain": {"command": [sys.executable, str(agent), "{prompt_file}"]}},
        default="plain",
    )

    monkeypatch.setenv("HOST_SECRET", "not for agents")
    with pytest.warns(FutureWarning, match="ask.toml is deprecated"):
        result = ask_sync(["notes"], "What is on my list?", registry=registry, env={"X_KEY": "1"})

    lines = result.answer.splitlines()
    assert lines[:2] == ["You asked: What is on my list?", "Todo says: buy oat milk"]
    # Nothing of the host leaks: exactly these variables reach the agent (PWD: bubblewrap
    # sets it where it starts the agent).
    expected = sorted(
        ["PATH", "PWD", "HOME", "TMPDIR", "NO_COLOR", "X_KEY", "SPAWNKIT_SESSION_ID",
         "SPAWNKIT_BUTLER", "SPAWNKIT_ROLE", "SPAWNKIT_WORKSPACE", "SPAWNKIT_RUN_HOME"]
    )  # fmt: skip
    assert lines[2] == f"Environment: {expected}"
    assert result.runtime == "plain"
    assert result.tool_calls == ()
    assert workspaces(isolated_home) == []
    record = record_of(result)
    assert (record.kind, record.runtime, record.sources) == ("ask", "command", ("notes",))


def test_a_failing_agent_raises_with_its_stderr_and_exit_code(
    isolated_home: Path, registry: SourceRegistry, tmp_path: Path
) -> None:
    agent = write_script(
        tmp_path / "failing_agent.py",
        """
        import os, sys
        print("partial thoughts")
        print(f"cannot reach the model from {os.getcwd()}", file=sys.stderr)
        sys.exit(3)
        """,
    )
    user_agents(isolated_home, {"bad": {"command": [sys.executable, str(agent)]}}, default="bad")

    with pytest.raises(AskError) as info:
        ask_sync(["notes", "single"], "q", registry=registry)

    error = info.value
    assert error.exit_code == 3
    assert error.runtime == "bad"
    assert "cannot reach the model from" in error.stderr
    assert str(error).startswith("bad failed (exit code 3): cannot reach the model from ")
    assert error.partial_answer == "partial thoughts"
    assert error.workdir is not None and str(error.workdir) in error.stderr
    assert not error.workdir.exists()
    assert workspaces(isolated_home) == []


async def test_a_hanging_agent_is_stopped_at_the_timeout(
    isolated_home: Path, registry: SourceRegistry, tmp_path: Path
) -> None:
    token = f"spawnkit-hanging-{os.getpid()}-{time.monotonic_ns()}"
    agent = write_script(
        tmp_path / "hanging_agent.py",
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "{token}"])
        print("thinking...", file=sys.stderr, flush=True)
        time.sleep(60)
        """,
    )
    user_agents(isolated_home, {"slow": {"command": [sys.executable, str(agent)]}}, default="slow")

    started = time.monotonic()
    with pytest.raises(AskError, match=r"no answer within 1\.5 s") as info:
        await ask(["notes"], "q", registry=registry, timeout_s=1.5)

    assert time.monotonic() - started < 10
    assert info.value.exit_code is None
    assert "thinking..." in info.value.stderr
    # The sandbox's processes have pids of their own: look for the agent's by what they run.
    survivors = [pid for pid in _with_token(token) if _alive(pid)]
    assert survivors == [], f"processes {survivors} survived the timeout"
    assert workspaces(isolated_home) == []
    record = SessionStore().get_session(info.value.record_id or "")
    assert record is not None and record.error_kind == "timeout"


def _with_token(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_cancelling_ask_removes_the_workdir(
    isolated_home: Path, registry: SourceRegistry, tmp_path: Path
) -> None:
    agent = write_script(tmp_path / "sleepy.py", "import time\ntime.sleep(60)\n")
    user_agents(isolated_home, {"slow": {"command": [sys.executable, str(agent)]}}, default="slow")
    events: list[RunEvent] = []

    task = asyncio.create_task(
        ask(["notes"], "q", registry=registry, timeout_s=30, on_event=events.append)
    )
    for _ in range(100):
        if workspaces(isolated_home):
            break
        await asyncio.sleep(0.05)
    assert len(workspaces(isolated_home)) == 1
    await asyncio.sleep(0.3)  # the agent is running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=10)
    assert workspaces(isolated_home) == []
    record = SessionStore().get_session(events[0].session_id)
    assert record is not None and (record.kind, record.status) == ("ask", "cancelled")


async def test_an_unknown_source_fails_before_anything_is_spawned(
    registry: SourceRegistry, isolated_home: Path
) -> None:
    server = scenario('[[turn]]\ntext = "should never be asked"\n')
    async with server.serve() as url:
        with pytest.raises(UnknownSourceError) as info:
            await ask(
                ["notes", "nope", "also-nope"], "q", base_url=url, env=KEYS, registry=registry
            )

    assert info.value.names == ("nope", "also-nope")
    assert "'nope', 'also-nope'" in str(info.value)
    assert server.requests == []
    assert workspaces(isolated_home) == []


def test_ask_sync_refuses_a_running_loop(registry: SourceRegistry) -> None:
    async def inside() -> None:
        with pytest.raises(Exception, match="use `await ask"):
            ask_sync(["notes"], "q", registry=registry)

    asyncio.run(inside())


def test_an_empty_question_is_refused(registry: SourceRegistry) -> None:
    with pytest.raises(Exception, match="the question is empty"):
        ask_sync(["notes"], "  \n", registry=registry)


# -- end to end: Codex and Gemini -------------------------------------------------------

SHELL_SCENARIO = """
[[turn]]
shell = "cat ./notes/todo.txt ./single ./repo/README.md"
[[turn]]
text = "Found: {{ last_tool_result }}"
"""


@pytest.mark.e2e
@pytest.mark.parametrize(
    "runtime",
    [
        pytest.param("codex", marks=pytest.mark.skipif(not CODEX.exists(), reason="no codex")),
        pytest.param("gemini", marks=pytest.mark.skipif(not GEMINI.exists(), reason="no gemini")),
    ],
)
async def test_ask_with_codex_and_gemini(
    registry: SourceRegistry,
    isolated_home: Path,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    runtime: str,
) -> None:
    server = scenario(SHELL_SCENARIO)
    provider, exporter = spans
    async with server.serve() as url:
        result = await ask(
            ["notes", "single", "repo"], "What is there?", runtime=runtime, base_url=url,
            env=KEYS, registry=registry, timeout_s=RUN_TIMEOUT_S, tracer_provider=provider,
        )  # fmt: skip

    for fragment in ("Found:", "buy oat milk", "Thursday 14:00", "BLUE HERON"):
        assert fragment in result.answer
    assert len(result.tool_calls) == 1 and result.tool_calls[0].status == "ok"
    assert result.session_id
    assert workspaces(isolated_home) == []
    check_recorded(result, ["notes", "single", "repo"], exporter)
    paths = {request.path for request in server.requests}
    assert any(("responses" if runtime == "codex" else "v1beta") in path for path in paths)


# -- chat on a terminal: a run of kind "chat" -------------------------------------------

FAKE_CHAT = """
import os, signal, sys
signal.signal(signal.SIGINT, lambda *_: print("[fake] got SIGINT", flush=True))
print("[fake] ready in", os.getcwd(), flush=True)
print("[fake] links:", sorted(n for n in os.listdir(".") if os.path.islink(n)), flush=True)
print("[fake] tty:", os.isatty(0) and os.isatty(1), flush=True)
print("[fake] pid namespace:", os.getpid() < 10, flush=True)
print("[fake] mcp:", open(".mcp.json").read().split(), flush=True)
print("[fake] sources:", sys.argv[1].replace(chr(10), " | "), flush=True)
try:
    open("notes/new.txt", "w")
except OSError as exc:
    print("[fake] write refused:", type(exc).__name__, flush=True)
try:
    import fcntl, termios
    fcntl.ioctl(0, termios.TIOCSTI, b"#")
    print("[fake] TIOCSTI allowed", flush=True)
except OSError:
    print("[fake] TIOCSTI refused", flush=True)
line = input("you> ")
print("[fake] echo:", line, "/", open("notes/todo.txt").readline().strip(), flush=True)
line = input("you> ")
print("[fake] bye", line, flush=True)
sys.exit(7)
"""


@pytest.fixture
def pexpect_mod() -> Any:
    return pytest.importorskip("pexpect")


def chat_records() -> list[SessionRecord]:
    return [r for r in SessionStore().list_sessions() if r.kind == "chat"]


def test_chat_is_a_sandboxed_recorded_run_on_the_terminal(
    pexpect_mod: Any, isolated_home: Path, registry: SourceRegistry, tmp_path: Path,
    library: Path,
) -> None:  # fmt: skip
    fake = write_script(tmp_path / "fake_chat.py", FAKE_CHAT)
    argv = [sys.executable, str(fake), "{sources}"]
    user_agents(isolated_home, {"fake": {"command": argv, "chat_command": argv}}, default="fake")
    child = pexpect_mod.spawn(
        sys.executable,
        ["-c", "import sys; from spawnkit.ask import chat; sys.exit(chat('notes,single'))"],
        env=dict(os.environ), cwd=str(tmp_path), encoding="utf-8", timeout=30,
    )  # fmt: skip
    try:
        child.expect(r"\[fake\] ready in (\S+)\r\n")
        cwd = Path(child.match.group(1))
        # The run's workspace under $SPAWNKIT_HOME, its ask/ folder the working directory.
        assert cwd.name == "ask" and cwd.parent.parent == isolated_home / "workspaces"
        assert workspaces(isolated_home) == [cwd.parent]
        (record,) = chat_records()
        assert record.status == "running" and record.completed_at is None
        child.expect_exact("[fake] links: ['notes', 'single']")
        child.expect_exact("[fake] tty: True")
        child.expect_exact("[fake] pid namespace: True")
        child.expect_exact("[fake] mcp: ['{', '\"mcpServers\":', '{}', '}']")
        child.expect_exact("[fake] sources: - ./notes/ | - ./single")
        child.expect_exact("[fake] write refused: OSError")
        child.expect_exact("[fake] TIOCSTI refused")  # it cannot type into this terminal
        child.expect_exact("you> ")
        child.sendline("hello there")
        child.expect_exact("[fake] echo: hello there / buy oat milk")
        child.expect_exact("you> ")
        # Ctrl-C goes to the CLI (it owns the terminal), not to spawnkit nor to bwrap.
        child.sendintr()
        child.expect_exact("[fake] got SIGINT")
        child.sendline("ok")
        child.expect_exact("[fake] bye ok")
        child.expect(pexpect_mod.EOF)
    finally:
        child.close()
    assert child.exitstatus == 7  # the CLI's exit code is chat()'s
    (record,) = chat_records()
    assert (record.butler, record.sources, record.sandbox) == ("ask", ("notes", "single"), "bwrap")
    assert (record.status, record.error) == ("failed", "command exited with code 7")
    assert record.given is not None and record.given["mcp_servers"] == []
    assert workspaces(isolated_home) == []
    assert processes_with_env("SPAWNKIT_SESSION_ID", record.id) == []
    assert not (library / "notes" / "new.txt").exists()
    frame = history_sessions(SessionStore(), kind="chat")
    assert list(frame["session_id"]) == [record.id]


def test_a_runtime_without_an_interactive_mode_cannot_chat(
    isolated_home: Path, registry: SourceRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spawnkit.ask import chat
    from spawnkit.errors import ConfigError

    user_agents(isolated_home, {"mute": {"command": [sys.executable]}}, default="mute")
    monkeypatch.setattr("spawnkit.ask._stdin_is_terminal", lambda: True)
    with pytest.raises(ConfigError, match="has no chat_command"):
        chat(["notes"], registry=registry)
    assert SessionStore().list_sessions() == [] and workspaces(isolated_home) == []


def test_chat_refuses_unknown_and_vanished_sources_before_anything_runs(
    isolated_home: Path, registry: SourceRegistry, library: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from spawnkit.ask import chat

    monkeypatch.setattr("spawnkit.ask._stdin_is_terminal", lambda: True)
    with pytest.raises(UnknownSourceError) as info:
        chat(["notes", "wiki", "blog"], registry=registry)
    assert info.value.names == ("wiki", "blog")
    (library / "single.md").unlink()
    with pytest.raises(SourcePathError, match="source 'single' does not exist"):
        chat(["notes", "single"], registry=registry)
    assert SessionStore().list_sessions() == [] and workspaces(isolated_home) == []


def test_chat_needs_a_terminal(registry: SourceRegistry) -> None:
    from spawnkit.ask import chat

    done = subprocess.run(
        [sys.executable, "-c", "from spawnkit.ask import chat; chat('notes')"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "chat needs a terminal" in done.stderr
    assert chat is not None


# Escape sequences and whitespace: a TUI moves the cursor instead of printing spaces.
_ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[A-Za-z~]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]|\s")


def _screen_text(child: Any, pexpect_mod: Any, wanted: str, timeout_s: float) -> str:
    """Read the TUI's output until ``wanted`` shows (compared without spaces and escapes)."""
    seen = ""
    needle = _ANSI.sub("", wanted)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(pexpect_mod.TIMEOUT):
            seen += child.read_nonblocking(size=65536, timeout=0.5)
        if needle in _ANSI.sub("", seen):
            return seen
    raise AssertionError(f"{wanted!r} did not appear; the screen showed:\n{_ANSI.sub('', seen)}")


@pytest.mark.e2e
@needs_claude
def test_chat_with_the_real_claude_cli_resumes_an_ask(
    pexpect_mod: Any, registry: SourceRegistry, isolated_home: Path
) -> None:
    server = scenario(
        '[[turn]]\nshell = "cat ./notes/todo.txt"\n'
        '[[turn]]\ntext = "ASK ANSWER: {{ last_tool_result }}"\n'
        '[[turn]]\nshell = "cat ./single"\n'
        '[[turn]]\ntext = "CHAT ANSWER: {{ last_tool_result }}"\n'
    )
    with server.serve_in_thread() as url:
        first = ask_sync(
            "notes,single", "What is in my notes?", base_url=url, env=KEYS, registry=registry
        )
        assert first.answer.startswith("ASK ANSWER: buy oat milk")
        code = (
            "import sys; from spawnkit.ask import chat; "
            f"sys.exit(chat('notes,single', resume={first.record_id!r}, base_url={url!r}, "
            "env={'ANTHROPIC_API_KEY': 'replay'}))"
        )
        child = pexpect_mod.spawn(
            sys.executable, ["-c", code], env={**os.environ, "TERM": "xterm-256color"},
            encoding="utf-8", timeout=30, dimensions=(40, 120),
        )  # fmt: skip
        try:
            _screen_text(child, pexpect_mod, "don't ask on", 60)  # the prompt box is up
            (record,) = chat_records()
            assert record.status == "running"
            child.send("And the meeting?")
            time.sleep(0.3)
            child.send("\r")
            _screen_text(child, pexpect_mod, "CHAT ANSWER: The meeting moved to Thursday", 60)
            child.send("/exit")
            time.sleep(0.3)
            child.send("\r")
            child.expect(pexpect_mod.EOF, timeout=30)
        finally:
            child.close(force=True)

    assert child.exitstatus == 0
    (record,) = chat_records()
    assert (record.status, record.sources, record.sandbox) == (
        "success",
        ("notes", "single"),
        "bwrap",
    )
    # The chat continued the ask's conversation: the model got the ask's turns back.
    assert record.parent_session_id == first.record_id
    assert record.runtime_session_id == first.session_id
    chat_request = json.dumps(server.requests[-1].body["messages"])
    assert "And the meeting?" in chat_request and "ASK ANSWER: buy oat milk" in chat_request
    system = json.dumps(server.requests[-1].body.get("system"))
    assert "- ./notes/" in system and "- ./single" in system  # the sources are listed
    assert workspaces(isolated_home) == []
    assert processes_with_env("SPAWNKIT_SESSION_ID", record.id) == []
