"""The one place that shapes how agent CLI processes start and end.

Two guarantees live here:

* **The child sees only the environment we chose.** ``claude_agent_sdk`` merges
  ``options.env`` over the parent's whole ``os.environ``, so an isolated dict
  passed there isolates nothing. Instead the CLI is started through a small
  bash wrapper that unsets every variable not named in ``SPAWNKIT_ENV_KEEP`` and
  ``exec``s the CLI: whatever the parent had, the CLI (and every tool it runs) starts
  from exactly that list, and no value is ever on a command line.
* **Nothing the CLI started outlives the run.** The CLI starts inside its
  run's sandbox (:mod:`spawnkit.containment.sandbox`: a pid namespace that dies with the
  run and with its owner). Besides, the wrapper puts it in a new session
  (``setsid``, same pid), records that pid, and the run's owner terminates the
  whole process group afterwards: SIGTERM, a grace period, then SIGKILL.

CLIs spawnkit runs directly (Codex, Gemini) go through :func:`run_lines`: an
exact environment, a new session, output framed into bounded lines and handed
over as they arrive, and the same group termination on every exit path. An agent
spawnkit talks to over its stdio (an ACP agent) goes through :func:`open_stdio`: the same
start, lines read in the same bounds, and the same end, with its stdin kept open.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import re
import shlex
import shutil
import signal
import string
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

KEEP_VAR = "SPAWNKIT_ENV_KEEP"
BINARY_VAR = "SPAWNKIT_REAL_CLI"
PIDFILE_VAR = "SPAWNKIT_PIDFILE"
TERMINATE_GRACE_S = 2.0
# How long a SIGKILLed group may take to be gone before terminate_group returns anyway.
KILL_WAIT_S = 10.0
PR_SET_PDEATHSIG = 1
# How often terminate_group looks whether the group is gone: first, and at the slowest.
FIRST_POLL_S = 0.002
LAST_POLL_S = 0.05
# How long a group may still answer signals (its members exited but not yet reaped: our
# child watcher and init reap within milliseconds) before each poll also reads every
# process's state to tell zombies from the living (work that grows with the host's
# processes, so it is done in a thread, and only then).
ZOMBIE_CHECK_AFTER_S = 0.05

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME_STARTS = string.ascii_letters + "_"

# Kept deliberately tiny: it runs before every CLI start and must cost milliseconds (no
# fork: builtins only). It starts with the host's whole environment (the SDK merges ours
# over it), so bash runs privileged (-p): no $BASH_ENV or $ENV file is sourced, no exported
# function imported, no SHELLOPTS read. It unsets every variable of its environment that is
# not kept, rather than passing the kept ones to ``env -i NAME=VALUE ...``: a command line
# is readable by every local user, and the values include the run's relay URL with its
# secret. env then drops, by name only, what bash cannot unset (SHELLOPTS and BASHOPTS are
# read-only; a name that is no shell identifier is passed on as it came) or adds itself
# (SHLVL, PWD). The names come from /proc/$$/environ (all of them, as this process got
# them); without /proc, from bash's exported variables.
_WRAPPER = """#!{bash} -p
# spawnkit: start the agent CLI with only the variables listed in {keep}.
unset -v __sk_keep __sk_cli __sk_pidfile __sk_drop __sk_env __sk_name __sk_sandbox __sk_stat
__sk_keep=" ${keep} " __sk_cli=${binary} __sk_pidfile=${{{pidfile}:-}}
__sk_drop=()
for __sk_name in SHLVL PWD; do
  if [[ $__sk_keep != *" $__sk_name "* ]]; then __sk_drop+=(-u "$__sk_name"); fi
done
if [[ -r /proc/$$/environ ]]; then
  mapfile -d '' __sk_env < /proc/$$/environ
  __sk_env=("${{__sk_env[@]%%=*}}")
else
  __sk_env=({prefixes})
fi
for __sk_name in "${{__sk_env[@]}}"; do
  if [[ $__sk_keep == *" $__sk_name "* ]]; then continue; fi
  if [[ $__sk_name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
    if [[ ${{!__sk_name@a}} != *x* ]]; then continue; fi
    if unset -v "$__sk_name" 2>/dev/null; then continue; fi
  fi
  __sk_drop+=(-u "$__sk_name")
done
__sk_sandbox=({sandbox})
{prelude}
if [[ -n "$__sk_pidfile" ]]; then echo $$ > "$__sk_pidfile"; fi
# setsid forks (changing the pid we just wrote) when we already lead a group.
if [[ -r /proc/$$/stat ]]; then read -r -a __sk_stat < /proc/$$/stat; fi
if [[ "${{__sk_stat[4]:-}}" == "$$" ]]; then
  exec {env} "${{__sk_drop[@]}}" "${{__sk_sandbox[@]}}" "$__sk_cli" "$@"
fi
exec {setsid}{env} "${{__sk_drop[@]}}" "${{__sk_sandbox[@]}}" "$__sk_cli" "$@"
"""


def die_with_parent(parent: int) -> None:
    """End this process when ``parent`` ends (Linux: the kernel's parent-death signal,
    asked for in the child, e.g. as ``preexec_fn``); at once if it already has."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it ended before the signal was asked for
        os._exit(1)


def write_env_filter(
    directory: Path, sandbox: Sequence[str] = (), prelude: Sequence[str] = ()
) -> Path:
    """Write the wrapper script into ``directory`` (the run's workspace).

    ``sandbox`` is the command line that goes before the CLI's (bwrap and its view);
    ``prelude``, lines the script runs just before it ``exec``s them (the sandbox's shell
    steps: see :mod:`spawnkit.containment.prelude`).
    """
    bash = shutil.which("bash") or "/bin/bash"
    setsid = shutil.which("setsid")
    script = _WRAPPER.format(
        bash=bash,
        keep=KEEP_VAR,
        pidfile=PIDFILE_VAR,
        binary=BINARY_VAR,
        setsid=f"{setsid} " if setsid else "",
        env=shutil.which("env", path="/usr/bin:/bin") or "/usr/bin/env",
        prefixes=" ".join(f"${{!{first}@}}" for first in _NAME_STARTS),
        sandbox=" ".join(shlex.quote(arg) for arg in sandbox),
        prelude="\n".join(prelude),
    )
    path = directory / "spawnkit-cli"
    path.write_text(script, encoding="utf-8")
    path.chmod(0o700)
    return path


def filtered_env(
    env: Mapping[str, str], binary: Path, pidfile: Path, extra_keep: Iterable[str] = ()
) -> dict[str, str]:
    """The variables to hand the wrapper: ``env`` plus the wrapper's own controls.

    ``extra_keep`` names variables a launcher sets itself after we build ``env``
    (the SDK's own markers); they survive the filter too.
    """
    names = sorted({*env, *extra_keep})
    for name in names:
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"invalid environment variable name: {name!r}")
    return {
        **env,
        KEEP_VAR: " ".join(names),
        BINARY_VAR: str(binary),
        PIDFILE_VAR: str(pidfile),
    }


def read_pidfile(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's counts; a zombie does too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a signal still reaches the group: a process of it runs, or has exited and
    is not reaped yet (a zombie)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_running(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies, already dead, do not count).
    Reads the state of every process of the host: not for the event loop."""
    if not _group_alive(pgid):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields[0] is the state, fields[2] the process group.
        if fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


async def terminate_group(pgid: int, grace: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM the process group, wait up to ``grace``, then SIGKILL it."""
    if pgid <= 1 or pgid == os.getpgrp():
        return  # never signal our own group (the wrapper had no setsid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
        # Most groups are gone within milliseconds of SIGTERM (an ACP agent, which never
        # exits by itself, is ended this way after every run).
        if not await _gone(pgid, grace):
            logger.debug("process group %d ignored SIGTERM; killing it", pgid)
            os.killpg(pgid, signal.SIGKILL)
            # A killed process still takes a moment to exit (longer on a loaded machine):
            # the group is over only once none of it runs.
            await _gone(pgid, KILL_WAIT_S)


async def _gone(pgid: int, within: float) -> bool:
    """Whether the group is gone within ``within`` seconds. A process group has no
    awaitable exit: it is polled soon, then less often."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    delay = FIRST_POLL_S
    while _group_alive(pgid):
        now = loop.time()
        if now >= start + within:
            return False
        if now >= start + ZOMBIE_CHECK_AFTER_S and not await asyncio.to_thread(
            _group_running, pgid
        ):
            return True  # only zombies left, which a reaper other than us must take
        await asyncio.sleep(delay)
        delay = min(delay * 2, LAST_POLL_S)
    return True


class LineFramer:
    """Splits a byte stream into text lines, bounding how long one line may grow.

    A line longer than ``max_line`` bytes is cut: its first ``max_line`` bytes
    come out with ``truncated`` set and the rest, up to the next newline, is
    dropped, so a runtime that never prints a newline cannot exhaust memory.
    """

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._buffer = bytearray()
        self._skipping = False

    def feed(self, chunk: bytes) -> list[tuple[str, bool]]:
        """Complete lines in ``chunk`` (with what was buffered), as (text, truncated)."""
        lines: list[tuple[str, bool]] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            piece = chunk[start:end]
            start = end + 1
            if self._skipping:
                self._skipping = False
                self._buffer.clear()
                continue
            self._buffer += piece
            # Over the bound with its end in this chunk: cut, and said to be.
            lines.append(self._take(truncated=len(self._buffer) > self.max_line))
        rest = chunk[start:]
        if not self._skipping:
            self._buffer += rest
            if len(self._buffer) > self.max_line:
                lines.append(self._take(truncated=True))
                self._skipping = True
        return lines

    def flush(self) -> tuple[str, bool] | None:
        """The last line if the stream ended without a newline."""
        if self._skipping or not self._buffer:
            self._buffer.clear()
            return None
        return self._take()

    def _take(self, truncated: bool = False) -> tuple[str, bool]:
        data = bytes(self._buffer[: self.max_line])
        self._buffer.clear()
        return data.decode("utf-8", errors="replace").rstrip("\r"), truncated


LineSink = Callable[[str, bool], None]
READ_CHUNK = 64 * 1024
DEFAULT_MAX_LINE = 8 * 1024 * 1024


async def _pump(stream: asyncio.StreamReader, sink: LineSink, max_line: int) -> None:
    framer = LineFramer(max_line)
    while chunk := await stream.read(READ_CHUNK):
        for text, truncated in framer.feed(chunk):
            sink(text, truncated)
    last = framer.flush()
    if last is not None:
        sink(*last)


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    """Write ``data`` to the child's stdin and close it.

    A CLI that exits before reading it all (a bad flag, missing credentials) closes the
    pipe: that is not an error of ours. Its exit code and stderr say what happened, so
    the broken pipe is only logged.
    """
    try:
        pipe.write(data)
        await pipe.drain()
        pipe.close()
        await pipe.wait_closed()
    except (BrokenPipeError, ConnectionResetError) as exc:
        logger.debug("the CLI closed its stdin before reading all of it: %s", exc)


async def _pump_file(fd: int, exited: asyncio.Task[Any], sink: LineSink, max_line: int) -> None:
    """Hand over the lines a child writes to the file ``fd`` as they arrive, until it has
    exited. Read at offsets of our own (``pread``): the child's descriptor shares the file
    position of ``fd``, and its writes move it.

    A file has no end-of-stream while its writer lives, so new data is polled for
    (every :data:`FILE_POLL_S`); once the child has exited, the rest is read at once.
    """
    framer = LineFramer(max_line)
    offset = 0
    while True:
        finished = exited.done()  # before the read: what it wrote before exiting is in
        chunk = os.pread(fd, READ_CHUNK, offset)
        if chunk:
            offset += len(chunk)
            for text, truncated in framer.feed(chunk):
                sink(text, truncated)
            continue
        if finished:
            break
        await asyncio.sleep(FILE_POLL_S)
    last = framer.flush()
    if last is not None:
        sink(*last)


FILE_POLL_S = 0.02
# How long the output may stay open once the CLI has exited. A process it started in a
# session of its own (out of reach of its group's end) can hold the pipe open for hours:
# the run would wait for it until its timeout. What the CLI wrote is in the pipe already.
OUTPUT_AFTER_EXIT_S = 2.0


async def run_lines(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    on_stdout: LineSink,
    on_stderr: LineSink,
    stdin: bytes | None = None,
    max_line: int = DEFAULT_MAX_LINE,
    stdout_via_file: bool = False,
) -> int:
    """Run a CLI in its own process group, handing over each output line as it arrives.

    The child gets exactly ``env`` (nothing is merged in from this process).
    Returns the exit code. On cancellation the whole group is terminated
    (SIGTERM, then SIGKILL) before the cancellation propagates; on any exit,
    processes the CLI left in its group are terminated too.

    ``stdout_via_file``: the child writes its stdout to a temporary file instead of a pipe,
    and its lines are read from there as they are written. Node programs need it:
    ``process.exit()`` drops what is still queued for a pipe, so the end of a large output
    (the Gemini CLI echoing a 1 MB prompt) is lost; writes to a file are synchronous in
    Node and never are. The file has no name (``O_TMPFILE``, or unlinked at once where
    that is missing): it ends with the last descriptor of it, so nothing is left behind
    whatever kills this process and the child.
    """
    stdout_file = tempfile.TemporaryFile() if stdout_via_file else None  # noqa: SIM115
    try:
        return await _run_lines(
            argv, env=env, cwd=cwd, on_stdout=on_stdout, on_stderr=on_stderr, stdin=stdin,
            max_line=max_line, stdout_fd=stdout_file.fileno() if stdout_file else None,
        )  # fmt: skip
    finally:
        if stdout_file is not None:
            stdout_file.close()


async def _run_lines(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    on_stdout: LineSink,
    on_stderr: LineSink,
    stdin: bytes | None,
    max_line: int,
    stdout_fd: int | None,
) -> int:
    proc = await _start(argv, env=env, cwd=cwd, stdin=stdin is not None, stdout_fd=stdout_fd)
    exited = asyncio.create_task(proc.wait())
    # Not proc.wait(), which on Python 3.11 waits for the pipes to close as well.
    gone = asyncio.create_task(proc.gone())
    try:
        if stdout_fd is not None:
            stdout_pump = _pump_file(stdout_fd, gone, on_stdout, max_line)
        else:
            assert proc.stdout is not None
            stdout_pump = _pump(proc.stdout, on_stdout, max_line)
        pumps = [
            asyncio.create_task(stdout_pump),
            asyncio.create_task(_pump(proc.stderr, on_stderr, max_line)),
        ]
        # Written while the output is read: a large stdin and a chatty CLI cannot block
        # each other on full pipes.
        feeder = (
            asyncio.create_task(_feed(proc.stdin, stdin))
            if stdin is not None and proc.stdin is not None
            else None
        )
        try:
            if not await _read_to_end(pumps, gone, argv[0]):
                # Our ends of the pipes the other process still holds: closed here, or
                # they stay open until it ends.
                proc.close_pipes()
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            if feeder is not None:
                feeder.cancel()
                await asyncio.gather(feeder, return_exceptions=True)
        return await exited
    finally:
        gone.cancel()
        await asyncio.shield(terminate_group(proc.pid))
        if not exited.done():
            await asyncio.shield(exited)
        proc.close_pipes()


class _Child:
    """A CLI started by :func:`_start`: its pipes on the event loop, its exit seen through
    a pidfd. Python 3.11's asyncio subprocesses start a thread per child to wait for it
    (its default child watcher), a third of what starting a child costs this process;
    where pidfds are missing this wraps such a subprocess instead."""

    def __init__(
        self,
        pid: int,
        stdout: asyncio.StreamReader | None,
        stderr: asyncio.StreamReader,
        stdin: asyncio.StreamWriter | None,
    ) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.stdin = stdin
        self.transports: list[asyncio.BaseTransport] = []

    async def gone(self) -> None:
        """Returns once the child has exited (its pipes may still be open)."""
        raise NotImplementedError

    async def wait(self) -> int:
        """The child's exit code, once it has exited."""
        raise NotImplementedError

    def close_pipes(self) -> None:
        for transport in self.transports:
            transport.close()


class _PidfdChild(_Child):
    def __init__(self, popen: subprocess.Popen[bytes], pidfd: int, **pipes: Any) -> None:
        super().__init__(popen.pid, **pipes)
        self._popen = popen
        loop = asyncio.get_running_loop()
        self._ended: asyncio.Future[None] = loop.create_future()
        self._pidfd = pidfd
        loop.add_reader(pidfd, self._exited)

    def _exited(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        if not self._ended.done():
            self._ended.set_result(None)

    async def gone(self) -> None:
        await asyncio.shield(self._ended)

    async def wait(self) -> int:
        await asyncio.shield(self._ended)
        return self._popen.wait()  # a zombie by now: reaped at once


class _AsyncioChild(_Child):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        super().__init__(proc.pid, proc.stdout, proc.stderr, proc.stdin)
        self._proc = proc
        transport = getattr(proc, "_transport", None)
        self.transports = [transport] if transport is not None else []

    async def gone(self) -> None:
        await _exit_of(self._proc)

    async def wait(self) -> int:
        return await self._proc.wait()


# Whether children can be waited for through pidfds here (Linux 5.3+); emptied if not.
_pidfds = [True] if hasattr(os, "pidfd_open") else []


async def _start(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, stdin: bool, stdout_fd: int | None
) -> _Child:
    """Start ``argv`` in a session of its own, its stderr (and stdout, unless it goes to
    ``stdout_fd``) piped to us, its stdin piped (``stdin``) or empty."""
    if not _pidfds:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=stdout_fd if stdout_fd is not None else asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=dict(env), cwd=cwd, start_new_session=True,
        )  # fmt: skip
        return _AsyncioChild(proc)
    # As in asyncio's own subprocess start: the fork and exec happen here, on the loop.
    popen = subprocess.Popen(  # noqa: ASYNC220
        list(argv), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=stdout_fd if stdout_fd is not None else subprocess.PIPE,
        stderr=subprocess.PIPE, env=dict(env), cwd=cwd, start_new_session=True,
    )  # fmt: skip
    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError:
        popen.kill()  # cannot be waited for here (no pidfds in this kernel): not run
        popen.wait()
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            if pipe is not None:
                pipe.close()
        _pidfds.clear()  # not again: the asyncio path from now on
        return await _start(argv, env=env, cwd=cwd, stdin=stdin, stdout_fd=stdout_fd)
    transports: list[asyncio.BaseTransport] = []
    try:
        stdout = None if popen.stdout is None else await _reading(popen.stdout, transports)
        assert popen.stderr is not None
        stderr = await _reading(popen.stderr, transports)
        writer = None if popen.stdin is None else await _writing(popen.stdin, transports)
    except BaseException:
        for transport in transports:
            transport.close()
        os.close(pidfd)
        popen.kill()
        popen.wait()
        raise
    child = _PidfdChild(popen, pidfd, stdout=stdout, stderr=stderr, stdin=writer)
    child.transports = transports
    return child


async def _reading(
    pipe: IO[bytes], transports: list[asyncio.BaseTransport]
) -> asyncio.StreamReader:
    """A reader of the child's end ``pipe`` on the event loop (its transport kept)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    transports.append(transport)
    return reader


async def _writing(
    pipe: IO[bytes], transports: list[asyncio.BaseTransport]
) -> asyncio.StreamWriter:
    """A writer to the child's stdin ``pipe`` on the event loop (its transport kept)."""
    loop = asyncio.get_running_loop()
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop))
    transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe)
    transports.append(transport)
    return asyncio.StreamWriter(transport, protocol, None, loop)


async def _exit_of(proc: asyncio.subprocess.Process) -> None:
    """Returns once ``proc`` has exited (a pidfd says so; else its exit code is polled)."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfds, or already exited and reaped
        while proc.returncode is None:  # noqa: ASYNC110 (nothing else tells the exit)
            await asyncio.sleep(FILE_POLL_S * 5)
        return
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _read_to_end(
    pumps: Sequence[asyncio.Task[None]], exited: asyncio.Task[None], name: str
) -> bool:
    """Until the output ends (True), or :data:`OUTPUT_AFTER_EXIT_S` after the CLI has
    exited with its output still open (False); a sink that raised stops it there."""
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[Any]] = set(pumps)
    deadline: float | None = None
    while pending:
        waiting = pending if exited.done() else {*pending, exited}
        timeout = None if deadline is None else max(0.0, deadline - loop.time())
        done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            logger.warning(
                "%s exited, and a process it started still holds its output open: "
                "the rest of that output is not read (the run's end stops that process)",
                Path(name).name,
            )
            return False
        for task in done:
            if task is exited:
                deadline = loop.time() + OUTPUT_AFTER_EXIT_S
            else:
                pending.discard(task)
                task.result()
    return True


class StdioChild:
    """A child spawnkit talks to over its stdio: lines out (bounded), bytes in.

    Made by :func:`open_stdio`, which owns its end.
    """

    def __init__(
        self, proc: asyncio.subprocess.Process, stderr: asyncio.Task[None], max_line: int
    ) -> None:
        self.proc = proc
        self._stderr = stderr
        self.pid = proc.pid
        self._framer = LineFramer(max_line)
        self._ready: list[tuple[str, bool]] = []
        self._ended = False

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def read_line(self) -> tuple[str, bool] | None:
        """The next stdout line as (text, truncated); None once stdout has closed."""
        assert self.proc.stdout is not None
        while not self._ready:
            if self._ended:
                return None
            chunk = await self.proc.stdout.read(READ_CHUNK)
            if chunk:
                self._ready += self._framer.feed(chunk)
                continue
            self._ended = True
            last = self._framer.flush()
            if last is not None:
                self._ready.append(last)
        return self._ready.pop(0)

    async def write(self, data: bytes) -> None:
        """Write to the child's stdin (a closed pipe raises ``ConnectionError``)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def exited(self, within_s: float) -> int | None:
        """The exit code once it has exited and its stderr is read (None: still running
        after ``within_s`` seconds)."""
        try:
            async with asyncio.timeout(within_s):
                code = await self.proc.wait()
                await asyncio.wait({self._stderr})
        except TimeoutError:
            return self.proc.returncode
        return code


@contextlib.asynccontextmanager
async def open_stdio(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    on_stderr: LineSink,
    max_line: int = DEFAULT_MAX_LINE,
) -> AsyncIterator[StdioChild]:
    """Start a CLI to talk to over its stdio, in its own process group, with exactly ``env``.

    Its stderr lines go to ``on_stderr`` as they arrive. However the block ends (its
    end, an exception, a cancellation) stdin is closed and the whole group is
    terminated (SIGTERM, then SIGKILL) before the block's exit goes on.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    assert proc.stderr is not None
    assert proc.stdin is not None
    stderr = asyncio.create_task(_pump(proc.stderr, on_stderr, max_line))
    try:
        yield StdioChild(proc, stderr, max_line)
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            proc.stdin.close()
        await asyncio.shield(terminate_group(proc.pid))
        if proc.returncode is None:
            await asyncio.shield(proc.wait())
        stderr.cancel()
        await asyncio.gather(stderr, return_exceptions=True)


async def run_interactive(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout_s: float | None = None
) -> int:
    """Run a CLI on this terminal (inherited stdio) in its own process group; its exit code.

    When stdin is the terminal and this process is in its foreground, the CLI's
    group is made the terminal's foreground group (so Ctrl-C reaches the CLI, not
    us) and the terminal is taken back afterwards. Leftover processes of the
    group are terminated, on cancellation too. Raises TimeoutError after ``timeout_s``
    (None: the caller bounds the wait).
    """
    tty = _foreground_tty()
    proc = await asyncio.create_subprocess_exec(*argv, env=dict(env), cwd=cwd, process_group=0)
    try:
        if tty is not None:
            _give_terminal(tty, proc.pid)
            # It may have touched the terminal before it owned it, and been stopped.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
        async with asyncio.timeout(timeout_s):
            return await proc.wait()
    finally:
        if tty is not None:
            _give_terminal(tty, os.getpgrp())
        await asyncio.shield(terminate_group(proc.pid))
        if proc.returncode is None:
            await asyncio.shield(proc.wait())


def _foreground_tty() -> int | None:
    """stdin's descriptor if it is a terminal whose foreground group is ours."""
    try:
        fd = 0
        if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except OSError as exc:
        logger.debug("no controlling terminal to hand over: %s", exc)
    return None


def _give_terminal(tty: int, pgid: int) -> None:
    """Make ``pgid`` the terminal's foreground group (SIGTTOU blocked while we do)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(tty, pgid)
    except OSError as exc:  # the group may already be gone
        logger.debug("could not hand the terminal to group %d: %s", pgid, exc)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
