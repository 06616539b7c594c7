"""Helpers for tests about what a run leaves behind: its processes and its workspace."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from spawnkit.containment.liveness import process_start
from spawnkit.containment.sweep import kill_processes
from spawnkit.store import SessionRecord, SessionStore

from .conftest import REPO, processes_with_env

# The agent's tool call sleeps for ten minutes: the run is mid-tool-call when stopped.
# Codex hands a long command back to the model after a few seconds and lets it run on;
# the model then takes ten minutes to answer, so the run stays mid-call there too.
SLEEPY = """
[[turn]]
shell = "echo started; sleep 600; echo woke"
[[turn]]
delay_ms = 600000
text = "woke up"
"""
NODE_CLIS = (REPO / "node_modules" / ".bin" / "codex").exists()


def sleeper(runtime: str = "claude-code", sandbox: str = "none") -> str:
    """butler.toml lines for a test butler on ``runtime``, sandboxed or not.

    Unsandboxed runs are the strict case here: nothing but spawnkit's own cancellation and
    sweep stands between them and leftover processes.
    """
    return f'[butler.runtime]\ntype = "{runtime}"\n[butler.sandbox]\nmode = "{sandbox}"\n'


def spawnkit_popen(*args: str, cwd: Path = REPO) -> subprocess.Popen[str]:
    """``spawnkit ARGS`` as a real process (with this test's SPAWNKIT_HOME)."""
    return subprocess.Popen(
        [sys.executable, "-m", "spawnkit", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=dict(os.environ),
    )  # fmt: skip


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout: float = 120,
    alive: Callable[[], bool] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        assert alive is None or alive(), f"the process died while waiting for {what}"
        time.sleep(0.05)


def running_session(store_path: Path | None = None) -> SessionRecord | None:
    with SessionStore(store_path) as store:
        running = store.list_sessions(status="running", limit=1)
    return running[0] if running else None


def _argv0(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def sleeping_tool(session_id: str) -> list[int]:
    """Pids of the run's ``sleep 600`` (its tool call), if it has started."""
    return [p for p in processes_with_env("SPAWNKIT_SESSION_ID", session_id)
            if Path(_argv0(p)).name == "sleep"]  # fmt: skip


def wait_until_mid_tool_call(alive: Callable[[], bool], timeout: float = 180) -> str:
    """The session id of the run, once its tool call is sleeping."""
    found: list[str] = []

    def mid_call() -> bool:
        record = running_session()
        if record is not None and sleeping_tool(record.id):
            found.append(record.id)
        return bool(found)

    wait_for("the run's tool call", mid_call, timeout, alive)
    return found[0]


def survivors(session_id: str, within: float = 5.0) -> list[int]:
    """The run's processes still alive after waiting up to ``within`` s for them to go."""
    deadline = time.monotonic() + within
    while (left := processes_with_env("SPAWNKIT_SESSION_ID", session_id)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return left


def kill_leftovers(session_id: str) -> None:
    """A failing test must not leave the run's processes behind either."""
    pids = processes_with_env("SPAWNKIT_SESSION_ID", session_id)
    kill_processes([(pid, start) for pid in pids if (start := process_start(pid))])


# -- an owner staged by hand ---------------------------------------------------------------

OWNER = """
import os, subprocess, sys, time
from datetime import UTC, datetime
from pathlib import Path
from spawnkit.store import SessionStore
from spawnkit.containment.sweep import run_home

db, session_id, workspace = sys.argv[1], sys.argv[2], Path(sys.argv[3])
store = SessionStore(db)
store.create_session(session_id, butler="b", runtime="claude-code", model=None, prompt="p",
                     context=None, trigger_source="external")
workspace.mkdir(parents=True)
(workspace / "notes.txt").write_text("written by the run")
store.mark_started(session_id, started_at=datetime.now(UTC), workspace=workspace)
env = {"PATH": os.environ["PATH"], "SPAWNKIT_SESSION_ID": session_id,
       "SPAWNKIT_WORKSPACE": str(workspace), "SPAWNKIT_RUN_HOME": run_home()}
# A tool in a session of its own, with a child of its own, as Gemini's would be.
tool = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], env=env, start_new_session=True)
print(tool.pid, flush=True)
time.sleep(600)
"""


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@dataclass
class Owner:
    """A process that owns a running session, as ``spawnkit run`` would, without a CLI."""

    proc: subprocess.Popen[str]
    session_id: str
    workspace: Path

    def tools(self) -> list[int]:
        return processes_with_env("SPAWNKIT_SESSION_ID", self.session_id)


@contextmanager
def staged_owner(db: Path | str, home: Path | None = None) -> Iterator[Owner]:
    """An owner recording into ``db``, with its workspace and two tool processes running.

    The workspace lies under ``home`` (by default this test's ``$SPAWNKIT_HOME``), as a
    real run's does, so that :func:`processes_with_env` counts its tools as this test's.
    """
    session_id = f"staged-{uuid.uuid4()}"
    home = home or Path(os.environ["SPAWNKIT_HOME"])
    workspace = home / "workspaces" / f"butler_b_{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(db), session_id, str(workspace)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SPAWNKIT_HOME": str(home)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip().isdigit(), proc.stderr.read() if proc.stderr else ""
        staged = Owner(proc, session_id, workspace)
        alive = lambda: proc.poll() is None  # noqa: E731
        wait_for("sh and its sleep", lambda: len(staged.tools()) == 2, 60, alive)
        yield staged
    finally:
        proc.kill()
        proc.wait()
        kill_leftovers(session_id)
