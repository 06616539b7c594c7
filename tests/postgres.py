"""A real, throw-away PostgreSQL server for the tests: never a mock.

Debian's binaries (``/usr/lib/postgresql/<version>/bin``, the newest version);
``./scripts/test`` installs them on a machine without. ``initdb`` and ``postgres`` refuse
to run as root, so as root they run as the ``postgres`` user (``runuser``), in a private
directory that user owns. TCP connections need a password (scram), so a wrong one is
refused as on a real server; the socket trusts local users (the tests' admin connection).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

PASSWORD = "s3cret-pw"
START_TIMEOUT_S = 60
_names = itertools.count()


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    socket_dir: Path
    pg_ctl: Path
    data: Path
    run_as: list[str]

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://postgres:{password}@{self.host}:{self.port}/{database}"

    def admin(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=str(self.socket_dir), port=self.port, user="postgres", dbname=database,
            autocommit=True,
        )  # fmt: skip

    def create_database(self) -> str:
        name = f"t{os.getpid()}_{next(_names)}"
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        subprocess.run(
            [*self.run_as, str(self.pg_ctl), "-D", str(self.data), "-m", "fast", "-w", "stop"],
            capture_output=True, timeout=START_TIMEOUT_S, check=False,
        )  # fmt: skip

    def start(self) -> None:
        options = f"-k {self.socket_dir} -p {self.port} -h {self.host} -F -c fsync=off"
        subprocess.run(
            [*self.run_as, str(self.pg_ctl), "-D", str(self.data), "-w", "-l",
             str(self.data.parent / "server.log"), "-o", options, "start"],
            capture_output=True, timeout=START_TIMEOUT_S, check=True,
        )  # fmt: skip


def _bin_dir() -> Path | None:
    versions = [
        p for p in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl") if p.parts[-3].isdigit()
    ]
    found = sorted(versions, key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = _bin_dir()
    if bin_dir is None:
        raise RuntimeError(
            "no PostgreSQL binaries in /usr/lib/postgresql/*/bin: ./scripts/test installs "
            "Debian's postgresql package"
        )
    base = Path(tempfile.mkdtemp(prefix="spawnkit-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(base, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    base.chmod(0o700)
    pwfile = base / "pw"
    pwfile.write_text(PASSWORD)
    if run_as:
        os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
    data = base / "data"
    subprocess.run(
        [*run_as, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--no-sync",
         "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"],
        capture_output=True, timeout=START_TIMEOUT_S, check=True,
    )  # fmt: skip
    server = PostgresServer("127.0.0.1", _free_port(), base, bin_dir / "pg_ctl", data, run_as)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
