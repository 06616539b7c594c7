"""``spawnkit adapter`` (the shell adapter contract) and ``spawnkit doctor``, as real processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spawnkit.store import SessionStore

from .conftest import REPO

pytestmark = pytest.mark.e2e


def spawnkit(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spawnkit", *args], capture_output=True, text=True, timeout=120,
        check=False, cwd=cwd, env={**os.environ, **env},
    )  # fmt: skip


def wait_status(runtime: str, session_id: str, cwd: Path, want: set[str]) -> str:
    deadline = time.monotonic() + 90
    while True:
        status = spawnkit("adapter", runtime, "check_status", session_id, cwd=cwd).stdout.strip()
        if status in want or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "brief.md").write_text("You are the contract test agent. Be brief.")
    (tmp_path / "state.json").write_text(json.dumps({"goal": "count words", "step": 1}))
    (tmp_path / "echo.toml").write_text('[[turn]]\ntext = "echo: {{ prompt }}"\n')
    (tmp_path / "slow.toml").write_text('[[turn]]\ndelay_ms = 10000\ntext = "slow done"\n')
    return tmp_path


@pytest.mark.parametrize("runtime", ["claude-code", "codex", "gemini"])
def test_capabilities(runtime: str, work: Path) -> None:
    done = spawnkit("adapter", runtime, "capabilities", cwd=work)
    assert done.returncode == 0, done.stderr
    caps = json.loads(done.stdout)
    assert caps["runtime"] == runtime
    assert {"supports_resume", "supports_subagents", "supports_parallel_sessions",
            "supports_mcp", "supports_system_prompt"} <= set(caps)  # fmt: skip


@pytest.mark.parametrize("runtime", ["claude-code", "codex"])
def test_spawn_check_status_and_state(runtime: str, work: Path) -> None:
    done = spawnkit(
        "adapter", runtime, "--replay", "slow.toml", "spawn", "brief.md", "state.json", "hi",
        cwd=work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    session_id = done.stdout.strip()
    assert len(session_id) == 36
    assert spawnkit("adapter", runtime, "check_status", session_id, cwd=work).stdout.strip() in {
        "pending", "active",
    }, "spawn returns while the run goes on"  # fmt: skip
    assert wait_status(runtime, session_id, work, {"completed", "failed"}) == "completed"
    state = json.loads((work / "state.json").read_text())
    assert state["goal"] == "count words", "the orchestrator's keys are kept"
    assert state["spawnkit"]["session_id"] == session_id
    assert state["spawnkit"]["status"] == "completed"
    assert state["spawnkit"]["output"] == "slow done"
    assert state["sessions"] == [session_id]
    record = SessionStore().get_session(session_id)
    assert record is not None and record.context is not None and "count words" in record.context
    log = SessionStore().get_session(session_id).log_dir / "adapter.log"  # type: ignore[union-attr]
    assert log.exists()


def test_resume_makes_a_linked_session(work: Path) -> None:
    first = spawnkit(
        "adapter", "codex", "--replay", "echo.toml", "spawn", "brief.md", "state.json", "one",
        cwd=work,
    ).stdout.strip()  # fmt: skip
    assert wait_status("codex", first, work, {"completed", "failed"}) == "completed"
    done = spawnkit(
        "adapter", "codex", "--replay", "echo.toml", "resume", first, "state.json", "two", cwd=work
    )
    assert done.returncode == 0, done.stderr
    second = done.stdout.strip()
    assert second != first
    assert wait_status("codex", second, work, {"completed", "failed"}) == "completed"
    record = SessionStore().get_session(second)
    assert record is not None and record.parent_session_id == first
    assert json.loads((work / "state.json").read_text())["sessions"] == [first, second]


def test_a_failed_session_reports_failed(work: Path) -> None:
    (work / "fail.toml").write_text('[[turn]]\nerror = { status = 500, message = "boom" }\n')
    session_id = spawnkit(
        "adapter", "claude-code", "--replay", "fail.toml", "spawn", "brief.md", "state.json", "x",
        cwd=work,
    ).stdout.strip()  # fmt: skip
    assert wait_status("claude-code", session_id, work, {"failed", "completed"}) == "failed"
    assert json.loads((work / "state.json").read_text())["spawnkit"]["success"] is False


def test_exit_codes(work: Path, tmp_path: Path) -> None:
    (work / "broken.json").write_text("{not json")
    (work / "list.json").write_text("[1, 2]")
    cases = [
        (("adapter", "codex", "spawn", "brief.md", "broken.json", "x"), {}, 2, "not JSON"),
        (("adapter", "codex", "spawn", "brief.md", "list.json", "x"), {}, 2, "JSON object"),
        (("adapter", "codex", "spawn", "missing.md", "state.json", "x"), {}, 2, "does not exist"),
        (("adapter", "codex", "check_status", "nope"), {}, 4, "unknown session"),
        (("adapter", "codex", "resume", "nope", "state.json", "x"), {}, 4, "unknown session"),
        (("adapter", "codex", "spawn", "brief.md", "state.json", "x"),
         {"SPAWNKIT_CODEX_CLI": str(tmp_path / "no-codex")}, 3, "npm install -g @openai/codex"),
        (("adapter", "gpt-cli", "capabilities"), {}, 2, "unknown runtime"),
    ]  # fmt: skip
    for args, env, code, message in cases:
        done = spawnkit(*args, cwd=work, **env)
        assert done.returncode == code, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert SessionStore().count_sessions() == 0


def test_doctor(work: Path, tmp_path: Path) -> None:
    done = spawnkit("doctor", "--json", cwd=REPO)
    assert done.returncode == 0, done.stdout
    report = json.loads(done.stdout)
    rows = {row["runtime"]: row for row in report["runtimes"]}
    assert set(rows) == {"claude-code", "codex", "gemini"}
    assert all(row["found"] and row["version"] for row in rows.values())
    assert "0.169.0" in rows["codex"]["version"] and "0.61.0" in rows["gemini"]["version"]
    servers = {row["butler"]: row for row in report["mcp_servers"]}
    assert set(servers) == {"health", "relationship", "general"}
    assert all(row["ok"] and "state_get" in row["tools"] for row in servers.values())
    missing = spawnkit("doctor", cwd=REPO, SPAWNKIT_GEMINI_CLI=str(tmp_path / "none"))
    assert missing.returncode == 1
    assert "gemini       missing  install it with: npm install -g @google/gemini-cli@0.61.0" in (
        missing.stdout
    )


def test_spawn_is_idempotent_while_the_session_is_active(work: Path) -> None:
    args = ("adapter", "codex", "--replay", "slow.toml", "spawn", "brief.md", "state.json", "hi")
    first = spawnkit(*args, cwd=work).stdout.strip()
    again = spawnkit(*args, cwd=work).stdout.strip()
    assert again == first, "the same brief and state file while active: the same session"
    other_state = spawnkit(*args[:6], "other.json", "hi", cwd=work).stdout.strip()
    assert other_state != first
    assert wait_status("codex", first, work, {"completed", "failed"}) == "completed"
    later = spawnkit(*args, cwd=work).stdout.strip()
    assert later not in (first, ""), "once it finished, a new session starts"
    assert wait_status("codex", later, work, {"completed", "failed"}) == "completed"
    assert SessionStore().count_sessions() == 3


# Imported first by every Python started with it on PYTHONPATH: a contract worker stops
# itself at once, before it can write its record, until the test continues it.
FREEZE_WORKER = """
import os, signal, sys
if "_worker" in sys.argv:
    os.kill(os.getpid(), signal.SIGSTOP)
"""


def _worker_of(home: Path) -> tuple[str, int]:
    """The session id and worker pid of the one contract session spawn has started."""
    deadline = time.monotonic() + 60
    while True:
        metas = list((home / "sessions").glob("*/contract.json"))
        meta = json.loads(metas[0].read_text()) if metas else {}
        if "worker_pid" in meta:
            return metas[0].parent.name, int(meta["worker_pid"])
        assert time.monotonic() < deadline, "spawn started no worker"
        time.sleep(0.05)


def _stopped(pid: int) -> bool:
    return "\nState:\tT" in Path(f"/proc/{pid}/status").read_text()


def test_spawn_is_idempotent_while_a_slow_session_is_pending_or_active_not_after(
    work: Path, isolated_home: Path
) -> None:
    """The peer's case: the first spawn on a slow scenario (a minute-long turn), identical
    spawns while its worker has not written the record yet (pending) and while it runs
    (active) return its id; once it has finished, the next spawn is a new session."""
    (isolated_home / "adapter.toml").write_text("[adapter]\nstart_timeout_s = 600\n")
    (work / "minute.toml").write_text('[[turn]]\ndelay_ms = 60000\ntext = "late"\n')
    (work / "freeze").mkdir()
    (work / "freeze" / "sitecustomize.py").write_text(FREEZE_WORKER)
    args = ("adapter", "codex", "--replay", "minute.toml", "spawn", "brief.md", "state.json")
    first = subprocess.Popen(
        [sys.executable, "-m", "spawnkit", *args, "first"], cwd=work, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(work / "freeze")},
    )  # fmt: skip
    session_id, worker = _worker_of(isolated_home)
    try:
        deadline = time.monotonic() + 60
        while not _stopped(worker):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        # Pending: the first spawn still waits for the record its frozen worker cannot write.
        assert SessionStore().get_session(session_id) is None
        status = spawnkit("adapter", "codex", "check_status", session_id, cwd=work)
        assert (status.returncode, status.stdout.strip()) == (0, "pending"), status.stderr
        pending = spawnkit(*args, "second, while pending", cwd=work)
        assert (pending.returncode, pending.stdout.strip()) == (0, session_id), pending.stderr
    finally:
        os.kill(worker, signal.SIGCONT)
        out, err = first.communicate(timeout=120)
    try:
        assert (first.returncode, out.strip()) == (0, session_id), err
        # Active: the worker runs the minute-long turn.
        status = spawnkit("adapter", "codex", "check_status", session_id, cwd=work)
        assert status.stdout.strip() in {"pending", "active"}, status.stderr
        active = spawnkit(*args, "third, while active", cwd=work)
        assert (active.returncode, active.stdout.strip()) == (0, session_id), active.stderr
        # Finished (stopped here rather than after a minute): the next spawn is a new session.
        os.kill(worker, signal.SIGTERM)
        assert wait_status("codex", session_id, work, {"completed", "failed"}) == "failed"
        quick = ("adapter", "codex", "--replay", "echo.toml", *args[4:], "fourth")
        after = spawnkit(*quick, cwd=work)
        assert after.returncode == 0, after.stderr
        later = after.stdout.strip()
        assert later not in (session_id, "")
        assert wait_status("codex", later, work, {"completed", "failed"}) == "completed"
        assert json.loads((work / "state.json").read_text())["sessions"] == [session_id, later]
        assert [r.status for r in SessionStore().list_sessions()] == ["success", "cancelled"]
    finally:  # a failed assertion must not leave the minute-long session running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker, signal.SIGTERM)


def test_a_spawn_that_times_out_leaves_no_session_behind(work: Path, isolated_home: Path) -> None:
    """Its worker, still starting, is stopped: no session runs that spawn said did not start,
    and the next identical spawn starts one of its own."""
    (isolated_home / "adapter.toml").write_text("[adapter]\nstart_timeout_s = 1\n")
    (work / "freeze").mkdir()
    (work / "freeze" / "sitecustomize.py").write_text(FREEZE_WORKER)
    args = ("adapter", "codex", "--replay", "echo.toml", "spawn", "brief.md", "state.json", "x")
    timed_out = spawnkit(*args, cwd=work, PYTHONPATH=str(work / "freeze"))
    assert timed_out.returncode == 1 and timed_out.stdout == ""
    assert timed_out.stderr == "spawnkit adapter: the session did not start within 1 s\n"
    session_id, worker = _worker_of(isolated_home)
    os.kill(worker, signal.SIGCONT)  # the SIGTERM spawn sent it takes effect now
    assert wait_status("codex", session_id, work, {"failed"}) == "failed"
    (isolated_home / "adapter.toml").unlink()
    again = spawnkit(*args, cwd=work)
    assert again.returncode == 0 and again.stdout.strip() not in (session_id, "")
    assert wait_status("codex", again.stdout.strip(), work, {"completed"}) == "completed"
    assert [r.id for r in SessionStore().list_sessions()] == [again.stdout.strip()]


def test_spawn_subagent_runs_as_a_butler_role(work: Path) -> None:
    roster = work / "roster" / "desk"
    roster.mkdir(parents=True)
    (roster / "butler.toml").write_text(
        '[butler]\nname = "desk"\nport = 18455\n'
        '[butler.agents.researcher]\ndescription = "Looks things up"\nprompt = "You research."\n'
    )
    (roster / "CLAUDE.md").write_text("You are the desk butler.")
    (work / "env.toml").write_text(
        '[[turn]]\nshell = "echo role=$SPAWNKIT_ROLE"\n[[turn]]\ntext = "{{ last_tool_result }}"\n'
    )
    base = (
        "adapter",
        "claude-code",
        "--roster",
        "roster",
        "--butler",
        "desk",
        "--replay",
        "env.toml",
    )
    done = spawnkit(*base, "spawn_subagent", "researcher", "brief.md", "state.json", "go", cwd=work)
    assert done.returncode == 0, done.stderr
    session_id = done.stdout.strip()
    assert wait_status("claude-code", session_id, work, {"completed", "failed"}) == "completed"
    assert json.loads((work / "state.json").read_text())["spawnkit"]["output"] == "role=researcher"
    assert SessionStore().get_session(session_id).role == "researcher"  # type: ignore[union-attr]
    unknown = spawnkit(*base, "spawn_subagent", "poet", "brief.md", "state.json", "go", cwd=work)
    assert unknown.returncode == 2 and "has no role 'poet' (roles: researcher)" in unknown.stderr
    codex = spawnkit(
        "adapter", "codex", "spawn_subagent", "r", "brief.md", "state.json", "x", cwd=work
    )
    assert codex.returncode == 2 and "codex runtime has no sub-agents" in codex.stderr


def test_start_mcp_server(work: Path, unused_tcp_port: int) -> None:
    import asyncio
    import signal
    import stat

    from spawnkit.home import spawnkit_home

    from . import mcp_clients

    roster = work / "roster" / "desk"
    roster.mkdir(parents=True)
    (roster / "butler.toml").write_text(f'[butler]\nname = "desk"\nport = {unused_tcp_port}\n')
    (roster / "CLAUDE.md").write_text("You are the desk butler.")
    args = ("adapter", "claude-code", "--roster", "roster", "--butler", "desk", "start_mcp_server")
    done = spawnkit(*args, cwd=work)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.strip())
    try:
        token_file = spawnkit_home() / "mcp" / f"desk-{unused_tcp_port}.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        url = f"http://127.0.0.1:{unused_tcp_port}/mcp"

        async def call(secret: str | None) -> bool:
            async with mcp_clients.http_client(url, secret) as client:
                return not (await client.call_tool("state_set", {"key": "k", "value": 1})).is_error

        assert asyncio.run(call(token_file.read_text().strip()))
        with pytest.raises(ExceptionGroup):
            asyncio.run(call(None))
        busy = spawnkit(*args, cwd=work)
        assert busy.returncode == 2 and "already in use" in busy.stderr
    finally:
        os.kill(pid, signal.SIGINT)
    assert SessionStore().state_get("desk", "k") == 1
    needs = spawnkit("adapter", "claude-code", "start_mcp_server", cwd=work)
    assert needs.returncode == 2 and "needs --butler" in needs.stderr


def test_session_timeout_comes_from_config(work: Path) -> None:
    from spawnkit.home import spawnkit_home

    (spawnkit_home() / "adapter.toml").write_text("[adapter]\ntimeout_s = 1\n")
    (work / "stuck.toml").write_text('[[turn]]\ndelay_ms = 60000\ntext = "late"\n')
    session_id = spawnkit(
        "adapter", "codex", "--replay", "stuck.toml", "spawn", "brief.md", "state.json", "x",
        cwd=work,
    ).stdout.strip()  # fmt: skip
    assert wait_status("codex", session_id, work, {"completed", "failed"}) == "failed"
    record = SessionStore().get_session(session_id)
    assert record is not None and record.error_kind == "timeout"
    (spawnkit_home() / "adapter.toml").write_text("[adapter]\ntimeout_seconds = 1\n")
    bad = spawnkit("adapter", "codex", "spawn", "brief.md", "state.json", "x", cwd=work)
    assert bad.returncode == 2 and "unknown keys timeout_seconds" in bad.stderr


def test_spawn_refuses_a_nul_byte_in_the_prompt(work: Path) -> None:
    (work / "nul.txt").write_bytes(b"count\x00words")
    done = spawnkit(
        "adapter", "codex", "--replay", "echo.toml", "spawn", "brief.md", "state.json",
        "@nul.txt", cwd=work,
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == (
        "spawnkit adapter: the prompt contains a NUL byte (at character 5), which no agent CLI "
        "can receive: remove it"
    )
    assert done.stdout == "" and SessionStore().count_sessions() == 0
