"""``spawnkit adapter`` (the shell adapter contract) and ``spawnkit doctor``, as real processes."""

from __future__ import annotations

import json
import os
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
    (tmp_path / "slow.toml").write_text('[[turn]]\ndelay_ms = 3000\ntext = "slow done"\n')
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
    rows = {row["runtime"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"claude-code", "codex", "gemini"}
    assert all(row["found"] and row["version"] for row in rows.values())
    assert "0.169.0" in rows["codex"]["version"] and "0.61.0" in rows["gemini"]["version"]
    missing = spawnkit("doctor", cwd=REPO, SPAWNKIT_GEMINI_CLI=str(tmp_path / "none"))
    assert missing.returncode == 1
    assert (
        "gemini       missing  install it with: npm install -g @google/gemini-cli" in missing.stdout
    )
