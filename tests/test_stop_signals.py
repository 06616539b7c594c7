"""SIGTERM and SIGHUP stop runs as Ctrl-C does: real ``spawnkit`` processes, real CLIs.

A run whose tool call sleeps for ten minutes is stopped mid-call; afterwards its record
says ``cancelled``, none of its processes survive (within 5 s), and its workspace is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from spawnkit.cli.contract import _read_meta
from spawnkit.containment.mcp_access import owner_token_path
from spawnkit.signals import Stopped, on_stop_signals, run
from spawnkit.store import SessionStore

from . import mcp_clients
from .conftest import workspaces_of
from .leftovers import (
    NODE_CLIS,
    SLEEPY,
    kill_leftovers,
    sleeper,
    sleeping_tool,
    spawnkit_popen,
    survivors,
    wait_for,
    wait_until_mid_tool_call,
)

RUNTIMES = ["claude-code", *(["codex", "gemini"] if NODE_CLIS else [])]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _stop(proc: subprocess.Popen[str], signum: int) -> tuple[int, str]:
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=90)
    return proc.returncode, err


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("runtime", "sandbox", "signum"),
    [
        *[(runtime, "none", signum) for runtime in RUNTIMES for signum in STOP_SIGNALS],
        ("claude-code", "bwrap", signal.SIGTERM),
    ],
    ids=lambda value: signal.Signals(value).name if isinstance(value, int) else str(value),
)
def test_a_stop_signal_cancels_spawnkit_run(
    make_butler, tmp_path: Path, runtime, sandbox: str, signum: int
) -> None:
    butler = make_butler("sleeper", extra=sleeper(runtime, sandbox))
    scenario = tmp_path / "sleepy.toml"
    scenario.write_text(SLEEPY)
    proc = spawnkit_popen("run", "--roster", str(butler.roster_dir), "--butler", "sleeper",
                          "--replay", str(scenario), "sleep on it")  # fmt: skip
    session_id = None
    try:
        session_id = wait_until_mid_tool_call(lambda: proc.poll() is None)
        assert workspaces_of("sleeper"), "the run has its workspace"
        code, err = _stop(proc, signum)
        assert code == 128 + signum, err
        name = signal.Signals(signum).name
        assert f"spawnkit: stopped by {name}; the run was cancelled and recorded" in err
        assert "Traceback" not in err
        record = SessionStore().get_session(session_id)
        assert record is not None
        assert (record.status, record.error_kind) == ("cancelled", "cancelled")
        assert survivors(session_id) == [], "a process of the run outlived it"
        assert workspaces_of("sleeper") == [], "the workspace outlived the run"
    finally:
        if proc.poll() is None:
            proc.kill()
        if session_id:
            kill_leftovers(session_id)


@pytest.mark.e2e
async def test_sigterm_stops_spawnkit_serve_and_cancels_its_runs(
    make_butler, tmp_path: Path, unused_tcp_port: int
) -> None:
    butler = make_butler(extra=sleeper())
    scenario = tmp_path / "sleepy.toml"
    scenario.write_text(SLEEPY)
    port = str(unused_tcp_port)
    proc = spawnkit_popen("serve", "health", "--roster", str(butler.roster_dir), "--port", port,
                          "--replay", str(scenario))  # fmt: skip
    session_id = None
    try:
        assert proc.stdout is not None
        assert "serving butler 'health'" in proc.stdout.readline()
        token = owner_token_path("health", unused_tcp_port).read_text().strip()
        url = f"http://127.0.0.1:{unused_tcp_port}/mcp"
        # The client lives in a task of its own: when the server goes away under it, its
        # transport fails and cancels whatever task holds it, which must not be the test.
        caller = asyncio.create_task(_trigger(url, token, "sleep on it"))
        try:
            session_id = await asyncio.to_thread(
                wait_until_mid_tool_call, lambda: proc.poll() is None
            )
            code, err = await asyncio.to_thread(_stop, proc, signal.SIGTERM)
        finally:
            caller.cancel()
            with contextlib.suppress(BaseException):
                await caller
        assert code == 0, err
        assert "stopped" in err and "Traceback" not in err
        record = SessionStore().get_session(session_id)
        assert record is not None and record.status == "cancelled"
        assert survivors(session_id) == []
        assert workspaces_of("health") == []
    finally:
        if proc.poll() is None:
            proc.kill()
        if session_id:
            kill_leftovers(session_id)


async def _trigger(url: str, token: str, prompt: str) -> None:
    async with mcp_clients.http_client(url, token) as client:
        await client.call_tool("trigger", {"prompt": prompt})


@pytest.mark.e2e
def test_sigterm_cancels_the_contract_worker(tmp_path: Path) -> None:
    scenario = tmp_path / "sleepy.toml"
    scenario.write_text(SLEEPY)
    brief, state = tmp_path / "brief.md", tmp_path / "state.json"
    brief.write_text("You are a test agent.")
    spawn = spawnkit_popen("adapter", "claude-code", "--replay", str(scenario), "spawn",
                           str(brief), str(state), "sleep on it")  # fmt: skip
    out, err = spawn.communicate(timeout=120)
    assert spawn.returncode == 0, err
    session_id = out.strip()
    try:
        worker = _read_meta(session_id)["worker_pid"]
        wait_for("the run's tool call", lambda: bool(sleeping_tool(session_id)), 180)
        os.kill(worker, signal.SIGTERM)
        wait_for("the worker to finish", lambda: _read_meta(session_id).get("done") is True, 90)
        record = SessionStore().get_session(session_id)
        assert record is not None and record.status == "cancelled"
        reported = json.loads(state.read_text())["spawnkit"]
        assert (reported["session_id"], reported["status"]) == (session_id, "failed")
        assert reported["error"] == "the run was cancelled"
        assert survivors(session_id) == []
        assert workspaces_of("adapter-claude-code") == []
    finally:
        kill_leftovers(session_id)


# -- the handlers themselves --------------------------------------------------------------


def test_run_restores_the_previous_handlers() -> None:
    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not expected to run")

    before = signal.signal(signal.SIGTERM, mine)
    hangup = signal.getsignal(signal.SIGHUP)
    try:

        async def main() -> str:
            assert signal.getsignal(signal.SIGTERM) is not mine, "ours while running"
            return "done"

        assert run(main()) == "done"
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGHUP) == hangup
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_signal_cancels_the_main_coroutine_and_says_which() -> None:
    cleaned: list[str] = []
    hangup = signal.getsignal(signal.SIGHUP)

    async def main() -> None:
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(30)
        finally:
            cleaned.append("cleanup ran")

    with pytest.raises(Stopped) as stopped:
        run(main())
    assert (stopped.value.signum, stopped.value.exit_code) == (signal.SIGHUP, 129)
    assert cleaned == ["cleanup ran"]
    assert signal.getsignal(signal.SIGHUP) == hangup


def test_on_stop_signals_stops_then_passes_the_signal_on() -> None:
    seen: list[str] = []

    def previous(signum: int, frame: object) -> None:
        seen.append(f"previous {signal.Signals(signum).name}")

    before = signal.signal(signal.SIGTERM, previous)
    try:
        restore = on_stop_signals(lambda: seen.append("stopped the runs"))
        assert restore is not None
        signal.raise_signal(signal.SIGTERM)
        assert seen == ["stopped the runs", "previous SIGTERM"]
        assert signal.getsignal(signal.SIGTERM) is previous, "restored once used"
        restore()  # harmless when already restored
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, before)
