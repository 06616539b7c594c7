"""The ``spawnkit`` command line, run as a real process (and its parser as a pure function)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from spawnkit.cli import build_parser
from spawnkit.config.credential_file import CredentialFile
from spawnkit.store import SessionStore

from . import mcp_clients
from .conftest import REPO, processes_with_env, workspaces_of
from .postgres import PASSWORD

DEMO = REPO / "roster" / "health" / "scenarios" / "demo.toml"


def spawnkit(
    *args: str, timeout: float = 120, cwd: Path = REPO, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spawnkit", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, **env}, cwd=cwd,
    )  # fmt: skip


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("spawnkit: error: ")
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_parser_reads_every_run_option() -> None:
    args = build_parser().parse_args(
        ["run", "--roster", "r", "--butler", "b", "--max-turns", "3", "--replay", "s.toml",
         "--external-mcp", "--json", "--context", "c", "do it"]
    )  # fmt: skip
    assert (args.command, args.roster, args.butler, args.max_turns) == ("run", Path("r"), "b", 3)
    assert (args.replay, args.external_mcp, args.json, args.context, args.prompt) == (
        Path("s.toml"), True, True, "c", "do it",
    )  # fmt: skip
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "no butler given"])


@pytest.mark.e2e
def test_run_with_replay_prints_json_and_streams_to_stderr() -> None:
    done = spawnkit(
        "run", "--roster", str(REPO / "roster"), "--butler", "health",
        "--replay", str(DEMO), "--json", "I weighed 72.4 kg this morning",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["success"] is True and result["butler"] == "health"
    assert [c["tool"] for c in result["tool_calls"]] == ["state_get", "Bash", "state_set", "Bash"]
    assert "change per week" in result["output"]
    assert result["trace_id"] and len(result["trace_id"]) == 32
    assert "⚙ health.state_set" in done.stderr and "✓ success" in done.stderr
    record = SessionStore().get_session(result["session_id"])
    assert record is not None and record.status == "success"

    listed = spawnkit("sessions", "--json")
    assert [s["id"] for s in json.loads(listed.stdout)] == [result["session_id"]]
    shown = spawnkit("sessions", result["session_id"][:8])
    assert shown.returncode == 0 and "trigger_source      external" in shown.stdout
    table = spawnkit("sessions")
    assert "health" in table.stdout and result["session_id"][:8] in table.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_demo_runs_offline_and_shows_the_record(where: str, tmp_path: Path) -> None:
    # Elsewhere there is no ./roster: the demo finds the installed package's examples.
    home = tmp_path / "fresh-home"  # not there yet: the demo creates it, and says so first
    done = spawnkit("demo", cwd=REPO if where == "checkout" else tmp_path, SPAWNKIT_HOME=str(home))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    says = f"It writes its session record, logs and workspace under {home} ($SPAWNKIT_HOME)."
    assert says in lines
    assert lines.index(says) < next(n for n, line in enumerate(lines) if line.startswith("▶"))
    assert "⚙ health.state_get" in done.stdout
    assert "The session record in" in done.stdout
    assert "status              success" in done.stdout
    assert SessionStore(home / "sessions.db").count_sessions() == 1


@pytest.mark.e2e
def test_demo_names_a_store_of_its_own_without_its_password(postgres_url: str) -> None:
    """With --json the record is stdout's; the line saying where it goes is on stderr."""
    done = spawnkit("--store", postgres_url, "demo", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "success"
    shown = postgres_url.replace(f":{PASSWORD}@", "@")
    home = os.environ["SPAWNKIT_HOME"]
    says = f"It writes its session record to {shown} and its logs and workspace under {home}"
    assert says in done.stderr and PASSWORD not in done.stderr + done.stdout
    assert SessionStore(postgres_url).count_sessions() == 1


def test_user_mistakes_are_one_line_errors(tmp_path: Path, make_butler) -> None:
    butler = make_butler()
    roster = str(butler.roster_dir)
    assert_one_line_error(
        spawnkit("run", "--roster", roster, "--butler", "nope", "hi"), "unknown butler 'nope'"
    )
    assert_one_line_error(
        spawnkit("run", "--roster", str(tmp_path / "missing"), "--butler", "x", "hi"),
        "no roster found",
        "--roster",
    )
    (Path(roster) / "health" / "butler.toml").write_text("[butler\nname = ")
    assert_one_line_error(
        spawnkit("run", "--roster", roster, "--butler", "health", "hi"),
        "butler.toml",
        "invalid TOML",
    )
    (Path(roster) / "health" / "butler.toml").write_text(
        '[butler]\nname = "health"\nport = 8101\n[butler.runtime]\ntype = "gpt-cli"\n'
    )
    assert_one_line_error(
        spawnkit("roster", "--roster", roster), "[butler.runtime.type]", "unknown runtime 'gpt-cli'"
    )


def test_missing_variable_and_missing_cli(make_butler, tmp_path: Path) -> None:
    butler = make_butler(extra='[butler.env]\nrequired = ["SPAWNKIT_TEST_SECRET"]\n')
    roster = str(butler.roster_dir)
    assert_one_line_error(
        spawnkit("run", "--roster", roster, "--butler", "health", "hi"),
        "requires SPAWNKIT_TEST_SECRET", "spawnkit credentials set",
    )  # fmt: skip
    plain = make_butler("plain")
    assert_one_line_error(
        spawnkit(
            "run", "--roster", str(plain.roster_dir), "--butler", "plain", "hi",
            SPAWNKIT_CLAUDE_CLI=str(tmp_path / "no-such-claude"),
        ),
        "cannot find", "npm install -g @anthropic-ai/claude-code",
    )  # fmt: skip
    keyless = ("run", "--roster", str(plain.roster_dir), "--butler", "plain", "--runtime",
               "codex", "hi")  # fmt: skip
    assert_one_line_error(
        spawnkit(*keyless, OPENAI_API_KEY="", CODEX_HOME=str(tmp_path / "codex")),
        "codex has no API key", "spawnkit credentials set OPENAI_API_KEY",
    )  # fmt: skip
    assert SessionStore().count_sessions() == 0, "nothing was accepted"
    # Said before the butler's MCP server and the run's stack are loaded, let alone started.
    imported = spawnkit(*keyless, OPENAI_API_KEY="", CODEX_HOME=str(tmp_path / "codex"),
                        PYTHONPROFILEIMPORTTIME="1").stderr  # fmt: skip
    assert "codex has no API key" in imported
    assert "spawnkit.serve.butler_server" not in imported
    assert not re.search(r"\|\s+mcp(\.|$)", imported, re.MULTILINE), "no MCP stack"


def test_bad_scenario_is_a_one_line_error(make_butler, tmp_path: Path) -> None:
    butler = make_butler()
    scenario = tmp_path / "bad.toml"
    scenario.write_text('[[turn]]\ntool = "x"\nbogus = 1\n')
    assert_one_line_error(
        spawnkit("run", "--roster", str(butler.roster_dir), "--butler", "health",
                 "--replay", str(scenario), "hi"),
        "bad.toml", "bogus",
    )  # fmt: skip
    assert_one_line_error(
        spawnkit("run", "--roster", str(butler.roster_dir), "--butler", "health",
                 "--replay", str(tmp_path / "missing.toml"), "hi"),
        "missing.toml", "cannot read scenario",
    )  # fmt: skip


def test_roster_and_credentials_commands() -> None:
    listing = spawnkit("roster", "--roster", str(REPO / "roster"))
    assert listing.returncode == 0
    assert "3 butler(s)" in listing.stdout
    for name in ("health", "relationship", "general"):
        assert name in listing.stdout
    assert spawnkit("credentials", "set", "MY_TOKEN", "s3cret").returncode == 0
    names = spawnkit("credentials", "list")
    assert names.stdout.split() == ["MY_TOKEN"] and "s3cret" not in names.stdout
    assert CredentialFile.default().get("MY_TOKEN") == "s3cret"
    assert spawnkit("credentials", "delete", "MY_TOKEN").returncode == 0
    assert_one_line_error(spawnkit("credentials", "delete", "MY_TOKEN"), "no stored credential")


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "spawnkit", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip


def _interrupt(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


@pytest.mark.e2e
def test_ctrl_c_cancels_the_run_and_records_it(make_butler, tmp_path: Path) -> None:
    butler = make_butler()
    slow = tmp_path / "slow.toml"
    slow.write_text('[[turn]]\ndelay_ms = 60000\ntext = "late"\n')
    proc = _start("run", "--roster", str(butler.roster_dir), "--butler", "health",
                  "--replay", str(slow), "wait")  # fmt: skip
    deadline = time.monotonic() + 60
    while not processes_with_env("SPAWNKIT_BUTLER", "health"):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        time.sleep(0.05)
    code, _, err = _interrupt(proc)
    assert code == 130, err[-3000:]
    assert "cancelled and recorded" in err and "Traceback" not in err
    (record,) = SessionStore().list_sessions()
    assert record.status == "cancelled"
    assert processes_with_env("SPAWNKIT_BUTLER", "health") == []
    assert workspaces_of("health") == []


def _first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    return line


@pytest.mark.e2e
def test_replay_serve_answers_the_messages_api(tmp_path: Path) -> None:
    scenario = tmp_path / "hello.toml"
    scenario.write_text('[[turn]]\ntext = "hello {{ prompt }}"\n')
    proc = _start("replay", "serve", str(scenario))
    try:
        url = _first_line(proc).split()[-1]
        assert url.startswith("http://127.0.0.1:")
        body = {"model": "m", "max_tokens": 10, "stream": False,
                "messages": [{"role": "user", "content": "world"}]}  # fmt: skip
        reply = httpx.post(f"{url}/v1/messages", json=body, timeout=10).json()
        assert reply["content"] == [{"type": "text", "text": "hello world"}]
    finally:
        code, _, err = _interrupt(proc)
    assert code == 0, err
    assert err.strip().splitlines()[-1] == f"replay server at {url} stopped by Ctrl-C"


@pytest.mark.e2e
def test_replay_serve_says_when_sigterm_stops_it(tmp_path: Path) -> None:
    scenario = tmp_path / "hello.toml"
    scenario.write_text('[[turn]]\ntext = "hello"\n')
    proc = _start("replay", "serve", str(scenario))
    try:
        url = _first_line(proc).split()[-1]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.strip().splitlines() == [f"replay server at {url} stopped by SIGTERM"]


def private_token(path: Path) -> str:
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    return path.read_text().strip()


@pytest.mark.e2e
async def test_serve_exposes_the_mcp_server(make_butler, unused_tcp_port, isolated_home) -> None:
    butler = make_butler()
    proc = _start(
        "serve", "health", "--roster", str(butler.roster_dir), "--port", str(unused_tcp_port)
    )
    try:
        assert "serving butler 'health'" in _first_line(proc)
        token_line = _first_line(proc)
        assert token_line.startswith("  token file: ")
        token_file = Path(token_line.split(": ", 1)[1].strip())
        assert token_file == isolated_home / "mcp" / f"health-{unused_tcp_port}.token"
        url = f"http://127.0.0.1:{unused_tcp_port}/mcp"
        async with mcp_clients.http_client(url, private_token(token_file)) as client:
            result = await client.call_tool("state_set", {"key": "from-cli", "value": 1})
            assert not result.is_error
        with pytest.raises(ExceptionGroup):
            async with mcp_clients.http_client(url, None) as client:
                await client.call_tool("state_set", {"key": "from-cli", "value": 2})
    finally:
        code, _, err = _interrupt(proc)
    assert code == 0, err
    assert SessionStore().state_get("health", "from-cli") == 1


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env={
        **os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    })  # fmt: skip


def test_sources_commands(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("buy milk")
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    _git(upstream, "init", "-q", "-b", "main")
    (upstream / "README.md").write_text("v1")
    _git(upstream, "add", ".")
    _git(upstream, "commit", "-q", "-m", "one")
    assert (
        "added directory source 'notes'" in spawnkit("sources", "add", "notes", str(notes)).stdout
    )
    added = spawnkit("sources", "add", "repo", str(upstream), "--git")
    assert added.returncode == 0, added.stderr
    listing = spawnkit("sources", "list", "--json")
    assert {s["name"]: s["kind"] for s in json.loads(listing.stdout)} == {
        "notes": "directory", "repo": "git",
    }  # fmt: skip
    (upstream / "NEW.md").write_text("v2")
    _git(upstream, "add", ".")
    _git(upstream, "commit", "-q", "-m", "two")
    assert spawnkit("sources", "update", "repo").returncode == 0
    from spawnkit.home import spawnkit_home

    assert (spawnkit_home() / "sources" / "git" / "repo" / "NEW.md").read_text() == "v2"
    assert_one_line_error(spawnkit("sources", "add", "notes", str(notes)), "notes")
    assert spawnkit("sources", "remove", "repo").returncode == 0
    assert [line.split()[0] for line in spawnkit("sources", "list").stdout.splitlines()] == [
        "notes"
    ]


@pytest.mark.e2e
def test_ask_through_the_cli(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("buy milk")
    scenario = tmp_path / "ask.toml"
    scenario.write_text(
        '[[turn]]\nshell = "cat ./notes/todo.txt"\n'
        '[[turn]]\ntext = "todo: {{ last_tool_result }}"\n'
    )
    assert spawnkit("sources", "add", "notes", str(notes)).returncode == 0
    for runtime in ("claude-code", "codex"):
        done = spawnkit(
            "ask", "--sources", "notes", "--runtime", runtime, "--replay", str(scenario), "--json",
            "what is on my todo?",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert (result["answer"], result["runtime"], result["sources"]) == (
            "todo: buy milk", runtime, ["notes"],
        )  # fmt: skip
        # The question is a recorded run: `spawnkit sessions` lists it as an ask.
        listed = json.loads(spawnkit("sessions", "--json").stdout)
        mine = [s for s in listed if s["id"] == result["record_id"]]
        assert mine and (mine[0]["kind"], mine[0]["sources"]) == ("ask", ["notes"])
    assert_one_line_error(
        spawnkit("ask", "--sources", "notes,nope", "--replay", str(scenario), "q"), "unknown source"
    )


def test_chat_through_the_cli(tmp_path: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    from spawnkit.home import spawnkit_home

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("buy milk")
    fake = tmp_path / "fake_chat.py"
    fake.write_text(
        "import os\nprint('[fake] in', sorted(os.listdir('.')), flush=True)\n"
        "line = input('you> ')\nprint('[fake] heard', line, flush=True)\n"
    )
    (spawnkit_home() / "ask.toml").write_text(
        f'[ask]\ndefault = "fake"\n[ask.agents.fake]\ncommand = ["unused"]\n'
        f'chat_command = ["{sys.executable}", "{fake}"]\n'
    )
    assert spawnkit("sources", "add", "notes", str(notes)).returncode == 0
    child = pexpect.spawn(
        sys.executable, ["-m", "spawnkit", "chat", "--sources", "notes"],
        env=dict(os.environ), cwd=str(tmp_path), encoding="utf-8", timeout=30,
    )  # fmt: skip
    try:
        child.expect_exact("[fake] in")
        child.expect_exact("'notes'")
        child.expect_exact("you> ")
        child.sendline("hello")
        child.expect_exact("[fake] heard hello")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_adapter_help_lists_only_public_commands() -> None:
    done = spawnkit("adapter", "--help")
    assert done.returncode == 0
    assert "SUPPRESS" not in done.stdout and "_worker" not in done.stdout
    for command in ("capabilities", "spawn", "resume", "check_status", "spawn_subagent"):
        assert command in done.stdout


@pytest.mark.e2e
def test_chat_on_the_replay_model_works_offline(tmp_path: Path) -> None:
    """A fresh HOME, no API key: Claude Code's first-run checks must not reach the network."""
    pexpect = pytest.importorskip("pexpect")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("buy milk")
    scenario = tmp_path / "chat.toml"
    scenario.write_text('[[turn]]\ntext = "REPLAYED ANSWER"\n')
    assert spawnkit("sources", "add", "notes", str(notes)).returncode == 0
    fresh_home = tmp_path / "fresh-home"
    fresh_home.mkdir()
    child = pexpect.spawn(
        sys.executable, ["-m", "spawnkit", "chat", "--sources", "notes", "--replay", str(scenario)],
        env={**os.environ, "HOME": str(fresh_home), "TERM": "xterm-256color"}, cwd=str(tmp_path),
        encoding="utf-8", timeout=120, dimensions=(40, 120),
    )  # fmt: skip
    seen = ""
    try:
        seen = _wait_for_screen(child, pexpect, "don't ask on", 120)  # the prompt box is up
        child.send("hello")
        time.sleep(0.3)
        child.send("\r")
        seen += _wait_for_screen(child, pexpect, "REPLAYED ANSWER", 60)
    finally:
        child.close(force=True)
    assert "ENOTFOUND" not in seen and "Unable to connect" not in seen


def _wait_for_screen(child: object, pexpect: object, wanted: str, timeout_s: float) -> str:
    """Read the terminal until ``wanted`` shows (a TUI moves the cursor instead of spacing)."""
    import re

    strip = re.compile(r"\x1b\[[0-9;?<>=]*[A-Za-z~]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]|\s")
    needle = strip.sub("", wanted)
    seen = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(pexpect.TIMEOUT):  # type: ignore[attr-defined]
            seen += child.read_nonblocking(size=65536, timeout=0.5)  # type: ignore[attr-defined]
        if needle in strip.sub("", seen):
            return seen
    raise AssertionError(f"{wanted!r} did not appear; the screen showed:\n{strip.sub('', seen)}")


def test_the_program_freezes_its_objects_out_of_the_exits_collections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console script and ``python -m spawnkit`` run ``process_main``: once a command has
    returned, what it loaded is frozen out of the interpreter's last collections (0.7 to
    0.9 s after a run, docs/benchmarks.md); ``main``, for in-process callers, freezes
    nothing."""
    import gc
    import tomllib

    from spawnkit.cli import main, process_main

    monkeypatch.setenv("SPAWNKIT_HOME", str(tmp_path))
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["spawnkit"] == "spawnkit.cli:process_main"
    assert "process_main()" in (REPO / "spawnkit" / "__main__.py").read_text()
    gc.unfreeze()
    try:
        assert main(["sessions"]) == 0
        assert gc.get_freeze_count() == 0
        assert process_main(["sessions"]) == 0
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
