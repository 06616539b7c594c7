"""Prompts of any size reach every real CLI: never as one command-line argument.

Linux refuses a single argument over 128 KiB (``Argument list too long``), so the prompt
goes to each CLI on stdin (Claude Code through the SDK's stream, Codex ``exec -``,
Gemini ``-p ""`` plus stdin) and the system prompt in a file. Each run here plays a
scenario that answers with the marker at the very end of a 1 MB prompt, and the replay
server's log shows the whole prompt reached the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from spawnkit.config.roster import load_roster
from spawnkit.replay import Scenario
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore

from .conftest import REPO

pytestmark = pytest.mark.e2e

MARKER = "END-MARKER-42"
ONE_MB = ("word " * 200_000)[: 1_000_000 - len(MARKER)] + MARKER  # 1,000,000 bytes
SCENARIO = f"""
[[script]]
match = "({MARKER})"
[[script.turn]]
text = "got {{{{ match.1 }}}}"
"""


def test_the_prompt_is_one_megabyte() -> None:
    assert len(ONE_MB.encode()) == 1_000_000


def scenario() -> Scenario:
    return Scenario.from_dict(tomllib.loads(SCENARIO), source="large.toml")


@pytest.mark.parametrize("runtime", ["claude-code", "codex", "gemini"])
async def test_a_one_megabyte_prompt_on_each_runtime(runtime: str) -> None:
    butler = load_roster(REPO / "roster")["general"].with_runtime(runtime)
    async with ButlerService(butler, replay=scenario()) as service:
        result = await service.trigger(ONE_MB)
        bodies = [json.dumps(r.body) for r in service.replay_server.requests]  # type: ignore[union-attr]
    assert result.success, result.error
    assert result.output == f"got {MARKER}"
    first = next(body for body in bodies if MARKER in body)
    assert first.count("word") >= 199_997, "the whole prompt reached the model"
    record = SessionStore().get_session(result.session_id or "")
    assert record is not None and len(record.prompt) == 1_000_000


def spawnkit(
    *args: str, stdin: str | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spawnkit", *args], input=stdin, capture_output=True,
        text=True, timeout=300, check=False, cwd=cwd, env=dict(os.environ),
    )  # fmt: skip


def test_run_reads_the_prompt_from_a_file_or_stdin(tmp_path: Path) -> None:
    (tmp_path / "large.toml").write_text(SCENARIO)
    (tmp_path / "prompt.txt").write_text(ONE_MB)
    base = ("run", "--roster", str(REPO / "roster"), "--butler", "general", "--json",
            "--replay", str(tmp_path / "large.toml"))  # fmt: skip
    from_file = spawnkit(*base, f"@{tmp_path / 'prompt.txt'}")
    assert from_file.returncode == 0, from_file.stderr[-2000:]
    assert json.loads(from_file.stdout)["output"] == f"got {MARKER}"
    from_stdin = spawnkit(*base, "--runtime", "codex", "-", stdin=ONE_MB)
    assert from_stdin.returncode == 0, from_stdin.stderr[-2000:]
    result = json.loads(from_stdin.stdout)
    assert (result["output"], result["runtime"]) == (f"got {MARKER}", "codex")
    literal = spawnkit(*base, "--runtime", "codex", "@@" + MARKER)
    assert json.loads(literal.stdout)["output"] == f"got {MARKER}"
    assert SessionStore().list_sessions(limit=1)[0].prompt == "@" + MARKER


def test_the_adapter_contract_takes_a_large_prompt(tmp_path: Path) -> None:
    (tmp_path / "large.toml").write_text(SCENARIO)
    (tmp_path / "brief.md").write_text("You are terse.")
    (tmp_path / "state.json").write_text("{}")
    done = spawnkit(
        "adapter", "codex", "--replay", "large.toml", "spawn", "brief.md", "state.json", "-",
        stdin=ONE_MB, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    session_id = done.stdout.strip()
    deadline = time.monotonic() + 180
    status = ""
    while status not in ("completed", "failed") and time.monotonic() < deadline:
        status = spawnkit("adapter", "codex", "check_status", session_id, cwd=tmp_path).stdout
        status = status.strip()
        time.sleep(0.3)
    assert status == "completed"
    assert json.loads((tmp_path / "state.json").read_text())["spawnkit"]["output"] == (
        f"got {MARKER}"
    )


@pytest.mark.parametrize(
    ("runtime", "size"), [("codex", 1_048_577), ("gemini", 8 * 1024 * 1024 + 1)]
)
async def test_a_prompt_over_the_cli_limit_fails_clearly(runtime: str, size: int) -> None:
    butler = load_roster(REPO / "roster")["general"].with_runtime(runtime)
    async with ButlerService(butler, replay=scenario()) as service:
        result = await service.trigger("x" * size)
    assert not result.success
    assert result.error_kind == "prompt_too_large"
    assert f"{size:,}" in (result.error or "")
