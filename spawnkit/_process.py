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
from typing import Any

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

    def feed_to(self, chunk: bytes, sink: LineSink) -> None:
        """:meth:`feed`, each line handed to ``sink``."""
        for text, truncated in self.feed(chunk):
            sink(text, truncated)

    def flush_to(self, sink: LineSink) -> None:
        """:meth:`flush`, the last line (if any) handed to ``sink``."""
        last = self.flush()
        if last is not None:
            sink(*last)

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
        framer.feed_to(chunk, sink)
    framer.flush_to(sink)


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
    processes the CLI left in its group are terminated too. A sink that raises stops
    the run the same way, and its exception comes out of here.

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
        child = _Child.start(
            argv, env=env, cwd=cwd, stdin=stdin, max_line=max_line,
            on_stdout=on_stdout, on_stderr=on_stderr,
            stdout_fd=stdout_file.fileno() if stdout_file else None,
        )  # fmt: skip
        try:
            if not await child.ended:
                logger.warning(
                    "%s exited, and a process it started still holds its output open: "
                    "the rest of that output is not read (the run's end stops that process)",
                    Path(argv[0]).name,
                )
            return await child.exited
        finally:
            child.stop()
            if _group_alive(child.pid):  # what it left in its group (rarely anything)
                await asyncio.shield(terminate_group(child.pid))
            if not child.exited.done():
                await asyncio.shield(child.exited)
    finally:
        if stdout_file is not None:
            stdout_file.close()


class _Child:
    """A CLI started by :func:`run_lines`, followed by callbacks on the event loop: its
    output pipes read as they become readable, its stdin written as it drains, its exit
    seen through a pidfd. No task, transport or stream per child: a no-op run's child
    costs this process a few callbacks, where asyncio's subprocess machinery took several
    tasks and a thread to wait for it (Python 3.11's default child watcher).

    ``ended`` resolves once the output has ended and the child has exited (True), or
    :data:`OUTPUT_AFTER_EXIT_S` after it exited with its output still open (False), or
    with the exception a sink raised; ``exited`` with its exit code. :meth:`stop` closes
    whatever is still open of ours.
    """

    def __init__(self, popen: subprocess.Popen[bytes], max_line: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.pid = popen.pid
        self._popen = popen
        self._max_line = max_line
        self.ended: asyncio.Future[bool] = self.loop.create_future()
        self.exited: asyncio.Future[int] = self.loop.create_future()
        self._readers: dict[int, tuple[LineFramer, LineSink]] = {}
        self._stdin: tuple[int, memoryview] | None = None
        self._pidfd: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._file: tuple[int, LineFramer, LineSink] | None = None
        self._file_offset = 0

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        stdin: bytes | None,
        max_line: int,
        on_stdout: LineSink,
        on_stderr: LineSink,
        stdout_fd: int | None,
    ) -> _Child:
        """Start ``argv`` in a session of its own, its stderr (and stdout, unless it goes
        to ``stdout_fd``) piped to us, ``stdin`` written to it (else an empty stdin)."""
        ours: list[int] = []  # our ends of its pipes
        theirs: list[int] = []
        try:
            stdout_r, stdout_w = (None, stdout_fd) if stdout_fd is not None else _pipe(ours, theirs)
            stderr_r, stderr_w = _pipe(ours, theirs)
            stdin_r, stdin_w = _pipe(theirs, ours) if stdin is not None else (None, None)
            # As in asyncio's own subprocess start: the fork and exec happen here, on the loop.
            popen = subprocess.Popen(
                list(argv), stdin=stdin_r if stdin_r is not None else subprocess.DEVNULL,
                stdout=stdout_w, stderr=stderr_w, env=dict(env), cwd=cwd,
                start_new_session=True,
            )  # fmt: skip
        except BaseException:
            for fd in (*ours, *theirs):
                os.close(fd)
            raise
        for fd in theirs:
            os.close(fd)
        child = cls(popen, max_line)
        try:
            if stdout_r is not None:
                child._read(stdout_r, on_stdout)
            elif stdout_fd is not None:
                child._file = (stdout_fd, LineFramer(max_line), on_stdout)
                child._poll_file()
            child._read(stderr_r, on_stderr)
            if stdin_w is not None:
                assert stdin is not None
                child._write(stdin_w, stdin)
            child._watch_exit()
        except BaseException:
            child.stop()
            popen.kill()
            popen.wait()
            raise
        return child

    # -- output ----------------------------------------------------------------------

    def _read(self, fd: int, sink: LineSink) -> None:
        os.set_blocking(fd, False)
        self._readers[fd] = (LineFramer(self._max_line), sink)
        self.loop.add_reader(fd, self._readable, fd)

    def _readable(self, fd: int) -> None:
        framer, sink = self._readers[fd]
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        try:
            if chunk:
                framer.feed_to(chunk, sink)
                return
            self._close_reader(fd)
            framer.flush_to(sink)
        except Exception as exc:  # noqa: BLE001 - a sink's: run_lines raises it
            self._fail(exc)
            return
        self._check_ended()

    def _close_reader(self, fd: int) -> None:
        self.loop.remove_reader(fd)
        del self._readers[fd]
        os.close(fd)

    def _poll_file(self) -> None:
        """Hand over what the child wrote to the file since the last look: read at offsets
        of our own (``pread``), since the child's descriptor shares the file position of
        ours and its writes move it. A file has no end-of-stream while its writer lives:
        it is looked at every :data:`FILE_POLL_S`, and read to its end once the child exits."""
        self._timer = None
        if self._file is None:
            return
        fd, framer, sink = self._file
        finished = self.exited.done()  # before the read: what it wrote before exiting is in
        try:
            while chunk := os.pread(fd, READ_CHUNK, self._file_offset):
                self._file_offset += len(chunk)
                framer.feed_to(chunk, sink)
            if finished:
                self._file = None
                framer.flush_to(sink)
        except Exception as exc:  # noqa: BLE001 - a sink's or the file's: run_lines raises it
            self._fail(exc)
            return
        if self._file is not None:
            self._timer = self.loop.call_later(FILE_POLL_S, self._poll_file)
        else:
            self._check_ended()

    # -- stdin -------------------------------------------------------------------------

    def _write(self, fd: int, data: bytes) -> None:
        """Write ``data`` to the child's stdin and close it, while its output is read: a
        large stdin and a chatty CLI cannot block each other on full pipes."""
        os.set_blocking(fd, False)
        self._stdin = (fd, memoryview(data))
        self._writable()
        if self._stdin is not None:
            self.loop.add_writer(fd, self._writable)

    def _writable(self) -> None:
        """A CLI that exits before reading it all (a bad flag, missing credentials) closes
        the pipe: not an error of ours (its exit code and stderr say what happened)."""
        assert self._stdin is not None
        fd, rest = self._stdin
        try:
            while rest:
                rest = rest[os.write(fd, rest) :]
        except BlockingIOError:
            self._stdin = (fd, rest)
            return
        except (BrokenPipeError, ConnectionResetError) as exc:
            logger.debug("the CLI closed its stdin before reading all of it: %s", exc)
        self._close_stdin()

    def _close_stdin(self) -> None:
        if self._stdin is not None:
            fd = self._stdin[0]
            self._stdin = None
            self.loop.remove_writer(fd)
            os.close(fd)

    # -- exit --------------------------------------------------------------------------

    def _watch_exit(self) -> None:
        """Be called back when the child exits: a pidfd on the loop (Linux 5.3+), else
        its exit polled, soon and then less often."""
        if _pidfds:
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except OSError:
                _pidfds.clear()  # not again: polled from now on
            else:
                self.loop.add_reader(self._pidfd, self._exited)
                return
        self._poll_exit(FIRST_POLL_S)

    def _poll_exit(self, delay: float) -> None:
        if self._popen.poll() is not None:
            self._exited()
        else:
            next_delay = min(delay * 2, LAST_POLL_S)
            self.loop.call_later(delay, self._poll_exit, next_delay)

    def _exited(self) -> None:
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if not self.exited.done():
            self.exited.set_result(self._popen.wait())  # a zombie by now: reaped at once
        if self._file is not None and self._timer is not None:
            self._timer.cancel()
            self._poll_file()  # the rest of it, at once
        elif not self._check_ended() and self._timer is None:
            self._timer = self.loop.call_later(OUTPUT_AFTER_EXIT_S, self._give_up)

    def _give_up(self) -> None:
        self._timer = None
        if not self.ended.done():
            self.ended.set_result(False)

    def _check_ended(self) -> bool:
        """Resolve ``ended`` once the output has ended and the child has exited."""
        if self._readers or self._file is not None or not self.exited.done():
            return False
        if not self.ended.done():
            self.ended.set_result(True)
        return True

    def _fail(self, exc: Exception) -> None:
        """A sink raised: nothing more is read (as a reading task would have stopped)."""
        if not self.ended.done():
            self.ended.set_exception(exc)
        self.stop()

    def stop(self) -> None:
        """Close our ends of its pipes (what another process still holds included) and
        stop polling; its exit is still watched."""
        for fd in list(self._readers):
            self._close_reader(fd)
        self._file = None
        self._close_stdin()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _pipe(read_ends: list[int], write_ends: list[int]) -> tuple[int, int]:
    """A new pipe (close-on-exec: Popen dups the child's end), its ends noted for closing."""
    read, write = os.pipe2(os.O_CLOEXEC)
    read_ends.append(read)
    write_ends.append(write)
    return read, write


# Whether children can be waited for through pidfds here (Linux 5.3+); emptied if not.
_pidfds = [True] if hasattr(os, "pidfd_open") else []


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
    proc = await _start_whole(
        argv,
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


async def _start_whole(argv: Sequence[str], **options: Any) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec`` that a cancellation cannot cut in two.

    The child (which leads a group of its own) exists before asyncio has connected its
    pipes; cancelled meanwhile, asyncio kills that child alone and waits for its pipes to
    close, which a process it started holds open: a hang, and that process left running.
    Here the start is finished, the whole group terminated, and the cancellation goes on.
    """
    start = asyncio.ensure_future(asyncio.create_subprocess_exec(*argv, **options))
    try:
        return await asyncio.shield(start)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # a start that failed left nothing to end
            proc = await start
            await terminate_group(proc.pid)
            if proc.returncode is None:
                await proc.wait()
        raise


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
    proc = await _start_whole(argv, env=dict(env), cwd=cwd, process_group=0)
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
