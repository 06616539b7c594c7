"""``spawnkit run`` with ``[butler.permissions] ask``: y/N on a terminal, nobody elsewhere.

The real command runs the real Claude Code CLI against the replay server; a
pseudo-terminal (pexpect) stands in for the person at the terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spawnkit.permissions import NO_APPROVER
from spawnkit.store import SessionStore

from .test_approval_card import roster_with_asking_butler

pytestmark = pytest.mark.e2e


@pytest.fixture
def pexpect_mod() -> Any:
    return pytest.importorskip("pexpect")


def run_args(roster: Path) -> list[str]:
    scenario = roster / "health" / "scenarios" / "write.toml"
    return ["-m", "spawnkit", "run", "--roster", str(roster), "--butler", "health",
            "--replay", str(scenario), "write the note"]  # fmt: skip


@pytest.mark.parametrize(("typed", "allowed"), [("y", True), ("", False)])
def test_the_terminal_asks_and_the_answer_is_honoured(
    pexpect_mod: Any, tmp_path: Path, typed: str, allowed: bool
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    roster = roster_with_asking_butler(tmp_path, out)
    child = pexpect_mod.spawn(
        sys.executable, run_args(roster), env=dict(os.environ), cwd=str(tmp_path),
        encoding="utf-8", timeout=120,
    )  # fmt: skip
    try:
        child.expect_exact("? Write asks to run")
        child.expect_exact("Allow? [y/N]")
        child.sendline(typed)
        child.expect_exact(f"Write: {'allowed' if allowed else 'denied'} (terminal)")
        child.expect(pexpect_mod.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert (out / "note.txt").exists() is allowed
    (record,) = SessionStore().list_sessions()
    assert [(a.allowed, a.by) for a in record.permissions] == [(allowed, "terminal")]


def test_not_on_a_terminal_nobody_is_asked(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    roster = roster_with_asking_butler(tmp_path, out)
    done = subprocess.run(
        [sys.executable, *run_args(roster)], stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Allow?" not in done.stdout + done.stderr
    assert "Write: denied (no approver)" in done.stdout
    assert not (out / "note.txt").exists()
    (record,) = SessionStore().list_sessions()
    assert [(a.allowed, a.by, a.reason) for a in record.permissions] == [
        (False, "no approver", NO_APPROVER.reason)
    ]


def test_ctrl_c_while_the_terminal_waits_cancels_the_run(pexpect_mod: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    roster = roster_with_asking_butler(tmp_path, out)
    child = pexpect_mod.spawn(
        sys.executable, run_args(roster), env=dict(os.environ), cwd=str(tmp_path),
        encoding="utf-8", timeout=120,
    )  # fmt: skip
    try:
        child.expect_exact("Allow? [y/N]")
        child.sendintr()
        child.expect(pexpect_mod.EOF)  # no thread left reading the terminal holds it
    finally:
        child.close()
    assert child.exitstatus != 0 or child.signalstatus is not None
    assert not (out / "note.txt").exists()
    (record,) = SessionStore().list_sessions()
    assert record.status == "cancelled"
    assert [(a.allowed, a.by) for a in record.permissions] == [(False, "cancelled")]
