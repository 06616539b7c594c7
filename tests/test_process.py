"""How agent CLI processes start and end: the env-filter wrapper and group termination.

Everything runs for real: the wrapper is executed by bash with a stand-in "CLI"
(``/usr/bin/env`` or a small script that reports its argv, pid and process group), and
termination is checked against real process groups read from ``/proc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spawnkit import _process
from spawnkit._process import (
    BINARY_VAR,
    KEEP_VAR,
    PIDFILE_VAR,
    filtered_env,
    read_pidfile,
    terminate_group,
    write_env_filter,
)

from .conftest import live_processes

RUN_TIMEOUT_S = 30
WAIT_S = 10.0
ENV_BINARY = Path("/usr/bin/env")
HAS_SETSID = shutil.which("setsid") is not None

TRICKY = {
    "PATH": "/usr/bin:/bin",
    "SPACES": "  two  spaces and a tab\t ",
    "QUOTES": """it's "double" and 'single'""",
    "DOLLAR": "$HOME ${PATH} $(id) `id` \\$ $$",
    "NEWLINES": "line one\nline two\n\n",
    "GLOB": "* ? [a-z]",
    "EMPTY": "",
    "UNICODE": "café ☕ ∑",
    "EQUALS": "a=b=c",
}


def run_wrapper(
    workspace: Path, filtered: dict[str, str], host: dict[str, str], *args: str
) -> subprocess.CompletedProcess[bytes]:
    """Start the wrapper as the SDK does: the filtered dict merged over host variables."""
    wrapper = write_env_filter(workspace)
    return subprocess.run(
        [str(wrapper), *args],
        env={**host, **filtered},
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def printed_env(output: bytes) -> dict[str, str]:
    """Parse ``env -0`` output (NUL-separated, so newlines in values survive)."""
    assert output.endswith(b"\0")
    pairs = [item.decode().partition("=") for item in output[:-1].split(b"\0")]
    return {name: value for name, _, value in pairs}


def write_script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o700)
    return path


# -- the env filter --------------------------------------------------------------------------


def test_filtered_env_adds_the_wrapper_controls(tmp_path: Path) -> None:
    env = {"PATH": "/bin", "B_VAR": "b", "A_VAR": "a"}
    filtered = filtered_env(env, Path("/opt/cli"), tmp_path / "cli.pid", extra_keep=["SDK_X"])
    assert filtered == {
        **env,
        KEEP_VAR: "A_VAR B_VAR PATH SDK_X",
        BINARY_VAR: "/opt/cli",
        PIDFILE_VAR: str(tmp_path / "cli.pid"),
    }
    assert env == {"PATH": "/bin", "B_VAR": "b", "A_VAR": "a"}, "the input is not changed"


def test_the_cli_sees_exactly_the_kept_variables(tmp_path: Path) -> None:
    filtered = filtered_env(TRICKY, ENV_BINARY, tmp_path / "cli.pid")
    host = {"PATH": "/usr/bin:/bin", "CANARY_SECRET": "must-not-leak", "HOME": "/root-ish"}
    proc = run_wrapper(tmp_path, filtered, host, "-0")
    assert (proc.returncode, proc.stderr) == (0, b"")
    child = printed_env(proc.stdout)
    assert child == TRICKY, "every kept value arrives byte for byte, and nothing else"
    assert b"must-not-leak" not in proc.stdout
    for control in (KEEP_VAR, BINARY_VAR, PIDFILE_VAR):
        assert control not in child


def test_a_kept_name_set_by_the_launcher_passes(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "OWN": "mine"}
    filtered = filtered_env(env, ENV_BINARY, tmp_path / "cli.pid", ["SDK_ENTRY", "NEVER_SET"])
    host = {"SDK_ENTRY": "sdk-py", "CANARY": "host only"}
    proc = run_wrapper(tmp_path, filtered, host, "-0")
    assert proc.returncode == 0, proc.stderr
    assert printed_env(proc.stdout) == {**env, "SDK_ENTRY": "sdk-py"}, (
        "an extra_keep name passes when set, and is absent (not empty) when not"
    )


def test_a_host_value_cannot_override_a_kept_one(tmp_path: Path) -> None:
    filtered = filtered_env({"PATH": "/usr/bin:/bin", "TOKEN": "ours"}, ENV_BINARY, tmp_path / "p")
    proc = run_wrapper(tmp_path, filtered, {"TOKEN": "host"}, "-0")
    assert printed_env(proc.stdout)["TOKEN"] == "ours"


def test_the_hosts_bash_startup_files_never_run(tmp_path: Path) -> None:
    """The SDK hands the wrapper the host's whole environment, BASH_ENV and functions too."""
    marker = tmp_path / "sourced"
    startup = tmp_path / "startup.sh"
    startup.write_text(f"echo sourced > {marker}\nexport LEAKED=yes\n")
    host = {
        "BASH_ENV": str(startup),
        "ENV": str(startup),
        "BASH_FUNC_env%%": "() { echo hijacked; }",  # an exported function named env
        "SHELLOPTS": "xtrace",
    }
    filtered = filtered_env({"PATH": "/usr/bin:/bin"}, ENV_BINARY, tmp_path / "cli.pid")
    proc = run_wrapper(tmp_path, filtered, host, "-0")
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "the wrapper sourced the host's BASH_ENV"
    seen = printed_env(proc.stdout)
    assert "LEAKED" not in seen and "BASH_ENV" not in seen
    assert b"hijacked" not in proc.stdout and b"+ " not in proc.stderr


def test_names_bash_cannot_unset_do_not_pass_either(tmp_path: Path) -> None:
    """A name that is no shell identifier (bash passes such entries on as they came), a
    read-only one, and names of the wrapper's own variables."""
    host = {"DASHED-NAME": "host", "dotted.name": "host", "SHELLOPTS": "braceexpand",
            "BASHOPTS": "extglob", "__sk_keep": "PATH CANARY", "CANARY": "host"}  # fmt: skip
    filtered = filtered_env({"PATH": "/usr/bin:/bin", "OWN": "1"}, ENV_BINARY, tmp_path / "p")
    proc = run_wrapper(tmp_path, filtered, host, "-0")
    assert proc.returncode == 0, proc.stderr
    assert printed_env(proc.stdout) == {"PATH": "/usr/bin:/bin", "OWN": "1"}


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to see every exec")
def test_no_value_is_ever_on_a_command_line(tmp_path: Path) -> None:
    """Every program the wrapper execs, up to the CLI, has only names on its command line:
    a command line is readable by every local user, and the values hold the run's secrets."""
    secret = "relay-secret-3f9c2e"
    env = {"PATH": "/usr/bin:/bin", "ANTHROPIC_BASE_URL": f"http://127.0.0.1:9/{secret}"}
    filtered = filtered_env(env, ENV_BINARY, tmp_path / "cli.pid")
    wrapper = write_env_filter(tmp_path)
    trace = tmp_path / "trace"
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-s", "65536", "-e", "trace=execve", "-o", str(trace),
         str(wrapper), "-0"],
        env={**filtered, "HOST_ONLY": "x"}, capture_output=True, timeout=RUN_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert printed_env(proc.stdout) == env
    execs = [line for line in trace.read_text().splitlines() if "execve(" in line]
    assert len(execs) >= 2, execs  # the wrapper, then env (and setsid) on the way
    assert [line for line in execs if secret in line] == []


ARGV_CLI = """
import json, sys
print(json.dumps(sys.argv[1:]))
"""


def test_arguments_pass_through_unchanged(tmp_path: Path) -> None:
    cli = write_script(tmp_path / "dir with spaces" / "fake cli", ARGV_CLI)
    filtered = filtered_env({"PATH": "/usr/bin:/bin"}, cli, tmp_path / "cli.pid")
    args = ["a b", "", "it's", '"q"', "$HOME", "*", "--flag=x y", "line\nbreak", "-0"]
    proc = run_wrapper(tmp_path, filtered, {}, *args)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == args


def test_the_cli_exit_code_is_the_wrappers(tmp_path: Path) -> None:
    cli = write_script(tmp_path / "cli", "import sys\nsys.exit(7)\n")
    filtered = filtered_env({"PATH": "/usr/bin:/bin"}, cli, tmp_path / "cli.pid")
    assert run_wrapper(tmp_path, filtered, {}).returncode == 7


IDENTITY_CLI = """
import json, os
print(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0)}))
"""


@pytest.mark.skipif(not HAS_SETSID, reason="needs setsid(1)")
def test_pidfile_names_the_cli_which_leads_its_own_group(tmp_path: Path) -> None:
    cli = write_script(tmp_path / "cli", IDENTITY_CLI)
    pidfile = tmp_path / "cli.pid"
    wrapper = write_env_filter(tmp_path)
    proc = subprocess.run(
        [str(wrapper)],
        env=filtered_env({"PATH": "/usr/bin:/bin"}, cli, pidfile),
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        check=True,
    )
    seen = json.loads(proc.stdout)
    assert read_pidfile(pidfile) == seen["pid"], "the pidfile holds the CLI's pid"
    assert seen["pgid"] == seen["pid"] == seen["sid"], "the CLI leads a new session and group"
    assert seen["pgid"] != os.getpgrp()


def test_no_pidfile_when_the_variable_is_empty(tmp_path: Path) -> None:
    cli = write_script(tmp_path / "cli", IDENTITY_CLI)
    filtered = filtered_env({"PATH": "/usr/bin:/bin"}, cli, tmp_path / "cli.pid")
    filtered[PIDFILE_VAR] = ""
    assert run_wrapper(tmp_path, filtered, {}).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli", "spawnkit-cli"]


def test_wrapper_script_is_owner_only(tmp_path: Path) -> None:
    wrapper = write_env_filter(tmp_path)
    assert wrapper == tmp_path / "spawnkit-cli"
    assert wrapper.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("env", "extra", "bad"),
    [
        ({"1BAD": "x"}, [], "1BAD"),
        ({"A-B": "x"}, [], "A-B"),
        ({"A B": "x"}, [], "A B"),
        ({"": "x"}, [], ""),
        ({"A=B": "x"}, [], "A=B"),
        ({"GOOD": "x"}, ["$(id)"], "$(id)"),
        ({"GOOD": "x"}, ["*"], "*"),
    ],
)
def test_filtered_env_rejects_invalid_names(
    tmp_path: Path, env: dict[str, str], extra: list[str], bad: str
) -> None:
    with pytest.raises(ValueError, match=r"^invalid environment variable name") as info:
        filtered_env(env, ENV_BINARY, tmp_path / "p", extra)
    assert str(info.value) == f"invalid environment variable name: {bad!r}"


def test_filtered_env_rejects_a_name_with_a_trailing_newline(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid environment variable name"):
        filtered_env({"TOKEN\n": "declared"}, ENV_BINARY, tmp_path / "p")


# -- pidfiles --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [("4242\n", 4242), (" 17 ", 17), ("", None), ("abc\n", None), ("12 34", None)],
)
def test_read_pidfile(tmp_path: Path, content: str, expected: int | None) -> None:
    (tmp_path / "cli.pid").write_text(content)
    assert read_pidfile(tmp_path / "cli.pid") == expected


def test_read_pidfile_missing(tmp_path: Path) -> None:
    assert read_pidfile(tmp_path / "absent.pid") is None


# -- terminating process groups ----------------------------------------------------------------


def group_members(pgid: int) -> dict[int, str]:
    """Live (non-zombie) pids in process group ``pgid``, with their command names."""
    return {pid: comm for pid, comm, fields in live_processes() if int(fields[2]) == pgid}


def ignores_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError(f"no SigIgn in /proc/{pid}/status")


async def wait_members(pgid: int, commands: list[str]) -> dict[int, str]:
    """Poll /proc (a group has no awaitable event) until the group runs ``commands``."""
    async with asyncio.timeout(WAIT_S):
        while sorted((members := group_members(pgid)).values()) != commands:
            await asyncio.sleep(0.01)
    return members


def wait_exited(pidfds: list[int]) -> None:
    """Block until every pidfd reports its process exited, bounded by WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    pending = list(pidfds)
    while pending:
        ready, _, _ = select.select(pending, [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"processes still running after {WAIT_S} s"
        pending = [fd for fd in pending if fd not in ready]


async def clean_up(proc: asyncio.subprocess.Process, pidfds: list[int]) -> None:
    """Whatever the test did, leave no member of the group (led by ``proc``) running."""
    for fd in pidfds:
        os.close(fd)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await asyncio.wait_for(proc.wait(), WAIT_S)


# The leader starts a child that ignores SIGTERM (inherited across exec), says so on
# stdout, then runs a foreground sleep (not its last command, so bash does not exec it).
STUBBORN_GROUP = """
( trap '' TERM; echo "stubborn $BASHPID"; exec sleep 300 ) &
echo "leader $$"
sleep 300
exit 0
"""


async def test_terminate_group_kills_every_member(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", STUBBORN_GROUP, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    pgid = proc.pid
    pidfds: list[int] = []
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT_S):
            said = dict([(await proc.stdout.readline()).split() for _ in range(2)])
        stubborn = int(said[b"stubborn"])
        assert int(said[b"leader"]) == pgid
        members = await wait_members(pgid, ["bash", "sleep", "sleep"])
        assert ignores_sigterm(stubborn)
        pidfds = [os.pidfd_open(pid) for pid in members]

        started = time.monotonic()
        await terminate_group(pgid, grace=0.5)
        elapsed = time.monotonic() - started

        assert await asyncio.wait_for(proc.wait(), WAIT_S) == -signal.SIGTERM
        await asyncio.to_thread(wait_exited, pidfds)
        assert group_members(pgid) == {}
        assert 0.5 <= elapsed < WAIT_S, "SIGKILL comes only after the grace period"
    finally:
        await clean_up(proc, pidfds)


async def test_terminate_group_on_a_gone_group_returns_quietly() -> None:
    proc = await asyncio.create_subprocess_exec("true", start_new_session=True)
    assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0
    started = time.monotonic()
    await terminate_group(proc.pid, grace=WAIT_S)
    assert time.monotonic() - started < 1.0


async def test_terminate_group_returns_at_once_when_the_group_obeys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A group that goes at SIGTERM is seen gone at once, by signals alone: the scan of the
    host's processes (work that grows with them) is left for groups that linger as zombies.
    One process, reaped by asyncio (an orphaned member would stay a zombie until PID 1
    reaps it, which takes its own time)."""
    scans: list[int] = []
    monkeypatch.setattr(_process, "_group_running", lambda pgid: scans.append(pgid) or True)
    # However slowly this machine reaps, only the signals can end the wait here.
    monkeypatch.setattr(_process, "ZOMBIE_CHECK_AFTER_S", WAIT_S)
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", "echo up; exec sleep 300", stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT_S):
            assert await proc.stdout.readline() == b"up\n"
        started = time.monotonic()
        await terminate_group(proc.pid, grace=WAIT_S)
        assert time.monotonic() - started < WAIT_S / 2, "gone once asyncio reaped it"
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == -signal.SIGTERM
        assert scans == []
    finally:
        await clean_up(proc, [])


async def test_a_group_left_as_a_zombie_counts_as_gone() -> None:
    """Its one member killed and never reaped (no one waits for it): a signal still reaches
    the group, but nothing of it runs, and terminate_group does not wait out its grace."""
    # A blocking Popen on purpose: asyncio's would reap it.
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)  # noqa: ASYNC220
    try:
        started = time.monotonic()
        await terminate_group(proc.pid, grace=WAIT_S)
        assert time.monotonic() - started < WAIT_S / 2
        assert _process._group_alive(proc.pid), "still a zombie: a signal reaches it"
        assert not _process._group_running(proc.pid)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not HAS_SETSID, reason="needs setsid(1)")
async def test_wrapper_pidfile_lets_the_owner_kill_the_cli_and_its_children(
    tmp_path: Path,
) -> None:
    # The "CLI" leaves a grandchild that ignores SIGTERM, like a tool left running.
    cli = tmp_path / "cli"
    cli.write_text(
        "#!/bin/bash\n"
        "( trap '' TERM; echo \"tool $BASHPID\"; exec sleep 300 ) &\n"
        'echo "cli $$"\n'
        "sleep 300\n"
    )
    cli.chmod(0o700)
    pidfile = tmp_path / "cli.pid"
    wrapper = write_env_filter(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        str(wrapper),
        env=filtered_env({"PATH": os.environ["PATH"]}, cli, pidfile),
        stdout=asyncio.subprocess.PIPE,
    )
    pidfds: list[int] = []
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT_S):
            said = dict([(await proc.stdout.readline()).split() for _ in range(2)])
        pgid = read_pidfile(pidfile)
        assert pgid == int(said[b"cli"]) == proc.pid
        members = await wait_members(pgid, ["cli", "sleep", "sleep"])
        assert int(said[b"tool"]) in members
        pidfds = [os.pidfd_open(pid) for pid in members]
        await terminate_group(pgid, grace=0.2)
        await asyncio.wait_for(proc.wait(), WAIT_S)
        await asyncio.to_thread(wait_exited, pidfds)
        assert group_members(pgid) == {}
    finally:
        await clean_up(proc, pidfds)


# terminate_group must never signal the caller's own group (a wrapper without setsid
# leaves the CLI there). Checked in a child process in its own session, so a
# regression kills that child, not the test run.
OWN_GROUP = """
import asyncio, os, signal
from spawnkit._process import terminate_group

received = []
signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
for pgid in (os.getpgrp(), 0, 1, -1):
    asyncio.run(terminate_group(pgid, grace=0.2))
print("survived", received, flush=True)
"""


def test_terminate_group_refuses_our_own_group() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", OWN_GROUP],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        start_new_session=True,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "survived []\n", "")
