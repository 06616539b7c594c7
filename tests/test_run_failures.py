"""Runs that failed are reported as failures, with the reason the CLI itself gave.

* A butler MCP server that never connected fails the run on every runtime (it would
  otherwise answer "successfully" without any of the butler's tools), and
  ``spawnkit doctor`` checks the MCP servers.
* A CLI that exits at once (a bad flag, missing auth), before spawnkit has written the
  prompt to its stdin, is reported with its own exit code and stderr, not as a lost
  connection.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from spawnkit.config.roster import ButlerConfig, load_roster
from spawnkit.serve.service import ButlerService

from .conftest import REPO, RosterFactory

pytestmark = pytest.mark.e2e

SCENARIO = REPO / "roster" / "general" / "scenarios" / "assistant.toml"
RUNTIMES = ["claude-code", "codex", "gemini"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def general_on(runtime: str, port: int) -> ButlerConfig:
    from dataclasses import replace

    return replace(load_roster(REPO / "roster")["general"].with_runtime(runtime), port=port)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_run_whose_mcp_server_never_connected_fails(runtime: str) -> None:
    butler = general_on(runtime, free_port())
    async with ButlerService(butler, replay=SCENARIO) as service:
        # The run is granted its secret as usual, but told of a port nothing serves (a
        # server that went away): the CLI never connects, the model answers all the same.
        dead = free_port()
        service.spawner.mcp_port = dead
        result = await service.trigger("count the words in: the cat sat")
    assert not result.success
    assert result.error_kind == "mcp_unavailable"
    assert f"MCP server 'general' at http://localhost:{dead}/mcp never connected" in (
        result.error or ""
    )


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_the_same_run_with_its_server_up_succeeds(runtime: str) -> None:
    butler = general_on(runtime, free_port())
    async with ButlerService(butler, replay=SCENARIO) as service:
        result = await service.trigger("count the words in: the cat sat")
    assert result.success, result.error


FAKE_CLI = """#!/bin/sh
echo "error: unexpected argument '--bogus' found" >&2
echo "" >&2
echo "Usage: cli [OPTIONS] [PROMPT]" >&2
echo "For more information, try '--help'." >&2
exit 3
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def failing_cli(tmp_path: Path) -> Path:
    return _script(tmp_path / "failing-cli", FAKE_CLI)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_cli_that_exits_at_once_reports_its_code_and_stderr(
    runtime: str, failing_cli: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("SPAWNKIT_CLAUDE_CLI", "SPAWNKIT_CODEX_CLI", "SPAWNKIT_GEMINI_CLI"):
        monkeypatch.setenv(variable, str(failing_cli))
    butler = general_on(runtime, free_port())
    # A prompt far larger than a pipe holds: writing it meets a closed pipe.
    async with ButlerService(butler, replay=SCENARIO) as service:
        result = await service.trigger("word " * 100_000)
    assert not result.success
    error = result.error or ""
    assert "exited with code 3: error: unexpected argument '--bogus' found" in error, error
    assert "Connection lost" not in error and "For more information" not in error


async def test_a_cli_gone_before_its_first_input_still_reports_its_code(
    failing_cli: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a loaded machine runs into: the CLI has exited before the SDK writes.

    The SDK then reports a lost connection first; the exit code must still be found.
    """
    from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

    connect = SubprocessCLITransport.connect

    async def connect_then_stall(self: SubprocessCLITransport) -> None:
        await connect(self)
        await asyncio.sleep(1.0)  # the failing CLI exits in milliseconds

    monkeypatch.setattr(SubprocessCLITransport, "connect", connect_then_stall)
    monkeypatch.setenv("SPAWNKIT_CLAUDE_CLI", str(failing_cli))
    butler = general_on("claude-code", free_port())
    async with ButlerService(butler, replay=SCENARIO) as service:
        result = await service.trigger("hello")
    assert not result.success
    error = result.error or ""
    assert "exited with code 3: error: unexpected argument '--bogus' found" in error, error


def spawnkit(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spawnkit", *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=cwd, env=dict(os.environ),
    )  # fmt: skip


def test_external_mcp_with_nothing_serving_is_never_a_success(make_butler: RosterFactory) -> None:
    from spawnkit.containment.mcp_access import owner_token, owner_token_path

    butler = make_butler("desk", extra='[butler.runtime]\ntools = ["Bash"]\n')
    args = ("run", "--roster", str(butler.roster_dir), "--butler", "desk", "--runtime", "codex",
            "--external-mcp", "--replay", str(SCENARIO), "--json", "hi")  # fmt: skip
    never_served = spawnkit(*args)
    assert never_served.returncode == 2, never_served.stderr
    assert "is the butler served?" in never_served.stderr
    owner_token(owner_token_path("desk", butler.port), create=True)  # served once, now gone
    gone = spawnkit(*args)
    assert gone.returncode == 1, gone.stderr
    result = json.loads(gone.stdout)
    assert result["runtime"] == "codex" and not result["success"]
    assert "cannot reach the MCP server" in result["error"]


class _NotMcp(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(404)
        self.end_headers()

    do_GET = do_POST

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def squatter() -> Iterator[int]:
    """Something on a port that is not an MCP server."""
    server = HTTPServer(("127.0.0.1", 0), _NotMcp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_doctor_checks_each_butlers_mcp_server(
    make_butler: RosterFactory, squatter: int, tmp_path: Path
) -> None:
    roster = make_butler("plain").roster_dir
    (roster / "taken").mkdir()
    (roster / "taken" / "butler.toml").write_text(f'[butler]\nname = "taken"\nport = {squatter}\n')
    (roster / "taken" / "CLAUDE.md").write_text("You are terse.")
    done = spawnkit("doctor", "--roster", str(roster), "--json")
    report = json.loads(done.stdout)
    servers = {row["butler"]: row for row in report["mcp_servers"]}
    assert servers["plain"]["ok"] and servers["plain"]["port_status"] == "free"
    assert "state_get" in servers["plain"]["tools"]
    assert servers["taken"]["ok"] and servers["taken"]["port_status"] == "other"
    assert done.returncode == 1
    text = spawnkit("doctor", "--roster", str(roster), "--butler", "taken").stdout
    assert f"port {squatter} is taken by something that is not this butler's MCP server" in text


def test_doctor_sees_a_served_butler_on_its_port(make_butler: RosterFactory) -> None:
    butler = make_butler("served")
    serve = subprocess.Popen(
        [sys.executable, "-m", "spawnkit", "serve", "served", "--roster", str(butler.roster_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        assert "serving butler 'served'" in serve.stdout.readline()
        done = spawnkit("doctor", "--roster", str(butler.roster_dir), "--json")
    finally:
        serve.send_signal(2)  # SIGINT: the way Ctrl-C stops it
        try:
            serve.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # SIGINT ignored (a nohup'd test run): no leftover
            serve.kill()
            serve.communicate()
    (server,) = json.loads(done.stdout)["mcp_servers"]
    assert (server["ok"], server["port_status"]) == (True, "serving")
