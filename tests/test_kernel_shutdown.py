"""A Jupyter kernel with the extension loaded: how it ends decides how its runs are recorded.

Real kernels (jupyter_client), a real Claude Code run whose tool call sleeps. A graceful
restart (a shutdown request) and SIGTERM or SIGHUP cancel the kernel's runs as an
interrupt does; a kernel killed outright leaves them to the sweep the next kernel runs
when it loads the extension.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

from spawnkit.home import default_store_path
from spawnkit.store import SessionStore

from .conftest import REPO, workspaces_of
from .leftovers import (
    SLEEPY,
    kill_leftovers,
    process_state,
    running_session,
    sleeper,
    sleeping_tool,
    staged_owner,
    survivors,
    wait_for,
)

pytestmark = pytest.mark.e2e


def _execute(client: Any, code: str, timeout: float = 60) -> dict[str, Any]:
    msg_id = client.execute(code)
    while True:
        reply = client.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply["content"])


@contextmanager
def kernel() -> Iterator[tuple[KernelManager, Any]]:
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(REPO), env=dict(os.environ))  # this test's SPAWNKIT_HOME
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield km, client
    finally:
        client.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "sleepy.toml"
    path.write_text(SLEEPY)
    return path


@pytest.fixture
def roster(make_butler) -> Path:
    """A butler without a sandbox: only the kernel's own handling can stop its runs."""
    return Path(make_butler("sleeper", extra=sleeper()).roster_dir)


def _start_background_run(client: Any, roster: Path, scenario: Path) -> str:
    assert _execute(client, "%load_ext spawnkit")["status"] == "ok"
    reply = _execute(
        client,
        f"%%spawn --butler sleeper --roster {roster} --replay {scenario} --background --out h\n"
        "sleep on it",
    )
    assert reply["status"] == "ok", reply
    found: list[str] = []

    def mid_call() -> bool:
        record = running_session()
        if record is not None and sleeping_tool(record.id):
            found.append(record.id)
        return bool(found)

    wait_for("the run's tool call", mid_call, 180)
    return found[0]


def _assert_cancelled_and_gone(session_id: str) -> None:
    record = SessionStore().get_session(session_id)
    assert record is not None
    assert (record.status, record.error_kind) == ("cancelled", "cancelled"), record.error
    assert survivors(session_id) == [], "a process of the run outlived the kernel"
    assert workspaces_of("sleeper") == [], "the workspace outlived the kernel"


def test_a_graceful_restart_records_the_runs_cancelled(roster: Path, scenario: Path) -> None:
    session_id = None
    try:
        with kernel() as (km, client):
            session_id = _start_background_run(client, roster, scenario)
            # The default is 5 s (SIGTERM at half of it); here the runs are recorded well
            # within 1 s, but a loaded machine must not fail the test.
            km.shutdown_wait_time = 60
            km.restart_kernel(now=False)
            _assert_cancelled_and_gone(session_id)
            assert _execute(client, "1 + 1")["status"] == "ok", "the new kernel works"
    finally:
        if session_id:
            kill_leftovers(session_id)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_cancels_the_kernels_runs(roster: Path, scenario: Path, signum: int) -> None:
    session_id = None
    try:
        with kernel() as (km, client):
            session_id = _start_background_run(client, roster, scenario)
            process = km.provisioner.process  # type: ignore[union-attr]
            process.send_signal(signum)
            assert process.wait(60) == -signum, "the signal still ends the kernel"
            _assert_cancelled_and_gone(session_id)
    finally:
        if session_id:
            kill_leftovers(session_id)


def test_after_a_forced_restart_the_new_kernel_sweeps_the_old_ones_runs(
    roster: Path, scenario: Path
) -> None:
    session_id = None
    try:
        with kernel() as (km, client):
            session_id = _start_background_run(client, roster, scenario)
            km.restart_kernel(now=True)  # SIGKILL: the old kernel cleans up nothing
            assert sleeping_tool(session_id), "precondition: the run outlived its kernel"
            client.wait_for_ready(timeout=60)
            assert _execute(client, "%load_ext spawnkit")["status"] == "ok"
            assert survivors(session_id) == []
            assert workspaces_of("sleeper") == []
        record = SessionStore().get_session(session_id)
        assert record is not None and record.status == "crashed"
        assert record.error is not None and "leftover process" in record.error
        assert record.error.endswith("killed, workspace removed")
    finally:
        if session_id:
            kill_leftovers(session_id)


def test_loading_the_extension_sweeps_what_a_dead_kernel_left(tmp_path: Path) -> None:
    with staged_owner(default_store_path()) as owner:
        tools = owner.tools()
        owner.proc.kill()
        wait_for("the owner to die", lambda: process_state(owner.proc.pid) == "Z", 30)
        with kernel() as (_, client):
            assert owner.tools() == tools, "precondition: its tools outlived it"
            assert _execute(client, "%load_ext spawnkit")["status"] == "ok"
            assert survivors(owner.session_id) == []
            assert not owner.workspace.exists()
        with SessionStore() as store:
            record = store.get_session(owner.session_id)
    assert record is not None and record.status == "crashed"
    assert record.error is not None and record.error.endswith(
        f"; {len(tools)} leftover processes killed, workspace removed"
    )
