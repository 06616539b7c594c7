"""``%%spawn`` in terminal IPython, through a pseudo-terminal: what a person sees.

Real Claude Code on the replay model: the transcript in the order it happened, a
live status line with the first turn's exact usage while the second turn waits,
the run shown once (``Out[n]`` is one line, not the transcript again), and a
stop (Ctrl-C) and a model overload each ending as one line without a traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pexpect
import pytest

from spawnkit.store import SessionStore

from .conftest import REPO, processes_with_env
from .test_browser import FIRST, OVERLOAD, STOPPED, STORY

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
PROMPT = r"In \[(\d+)\]: "
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture
def shell(tmp_path: Path, isolated_home: Path) -> pexpect.spawn:
    roster = tmp_path / "roster"
    shutil.copytree(REPO / "roster", roster)
    for name, text in {"story": STORY, "stopped": STOPPED, "overload": OVERLOAD}.items():
        (tmp_path / f"{name}.toml").write_text(text)
    # The pty's own size counts, not COLUMNS/LINES (pytest-xdist's workers set them to 80x24).
    inherited = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env = {**inherited, "NO_COLOR": "1", "TERM": "xterm", "SPAWNKIT_HOME": str(isolated_home)}
    child = pexpect.spawn(
        sys.executable, ["-m", "IPython", "--simple-prompt", "--colors=NoColor", "--no-banner",
                         "--HistoryManager.enabled=False"],
        cwd=str(tmp_path), env=env, encoding="utf-8", dimensions=(50, 220), timeout=180,
    )  # fmt: skip
    child.expect(PROMPT)
    child.sendline("%load_ext spawnkit")
    child.expect(PROMPT)
    yield child
    child.sendline("exit")
    child.expect(pexpect.EOF, timeout=60)


def cell(child: pexpect.spawn, line: str, body: str) -> None:
    child.sendline(line)
    child.sendline(body)
    child.sendline("")  # a cell magic's body ends with two empty lines
    child.sendline("")


def screen(text: str) -> str:
    """What the terminal shows: escape codes gone, each line as last redrawn."""
    lines = []
    for raw in ANSI.sub("", text).replace("\r\n", "\n").split("\n"):
        lines.append(raw.split("\r")[-1])
    return "\n".join(lines)


def test_a_run_in_terminal_ipython(shell: pexpect.spawn, tmp_path: Path) -> None:
    roster = tmp_path / "roster"
    cell(
        shell, f"%%spawn --butler health --roster {roster} --replay story.toml --out r", "weigh in"
    )
    cache = f"{FIRST['cache_read_input_tokens']:,} read / {FIRST['cache_creation_input_tokens']:,}"
    figures = (
        f"{FIRST['input_tokens']:,} in / {FIRST['output_tokens']:,} out tokens · cache "
        f"{cache} write"
    )
    # The status line while the second turn waits: the first turn's usage, exactly.
    shell.expect_exact(f"waiting on the model · turn 1/12 · 1 tool call · {figures}")
    seen = shell.before + shell.after
    shell.expect(PROMPT)
    text = screen(seen + shell.before)
    order = ["Reading the log first.", "⚙ health.state_get", "The old log, too.",
             "⚙ Bash  $ cat /nonexistent/weights.csv", "✗", "⚙ Bash  $ echo 72.4",
             "## Weight trend", "✓ success · 3 tool calls (1 failed)"]  # fmt: skip
    positions = [text.find(part, text.find(order[0])) for part in order]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), text
    assert text.count("## Weight trend") == 1, "shown once: Out[n] does not repeat it"
    assert re.search(r"Out\[\d+\]: SpawnerResult\(ok, 3 tool calls", text), text
    assert "waiting on the model" not in text.split("✓ success")[-1], "the status line is gone"


def test_a_stop_and_an_overload_in_terminal_ipython(shell: pexpect.spawn, tmp_path: Path) -> None:
    roster = tmp_path / "roster"
    cell(shell, f"%%spawn --butler health --roster {roster} --replay stopped.toml", "wait")
    shell.expect_exact("⚙ Bash  $ echo started")
    shell.expect_exact("started")  # the tool's result line: the model turn now waits
    shell.sendintr()
    shell.expect(PROMPT)
    text = screen(shell.before)
    assert text.count("RunCancelled: the run was stopped and recorded as cancelled") == 1, text
    for leak in ("Traceback", "KeyboardInterrupt", "exit code 143", "Fatal error", 'File "'):
        assert leak not in text, f"{leak!r} leaked:\n{text}"
    cell(shell, f"%%spawn --butler health --roster {roster} --replay overload.toml", "fail")
    shell.expect(PROMPT)
    text = screen(shell.before)
    assert text.count("API Error: 529") == 1 and "RunFailed: the run failed" in text, text
    assert "overloaded: this is temporary, retry in a minute" in text
    for leak in ("Traceback", "base_url", "127.0.0.1", 'File "'):
        assert leak not in text, f"{leak!r} in:\n{text}"
    shell.sendline("%spawn_debug")
    shell.expect(PROMPT)
    debug = screen(shell.before)
    assert "error_kind overloaded" in debug and "Python traceback:" in debug
    records = SessionStore().list_sessions()
    assert sorted(r.status for r in records) == ["cancelled", "failed"]
    for record in records:
        assert processes_with_env("SPAWNKIT_SESSION_ID", record.id) == []
