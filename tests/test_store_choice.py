"""Every command that reads the session store uses the one chosen: ``$SPAWNKIT_STORE`` or
``--store``, before or after the (sub)command; never ``$SPAWNKIT_HOME/sessions.db`` behind
the user's back. Real processes against a real PostgreSQL server (tests/postgres.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spawnkit.result import SpawnerResult
from spawnkit.store import SessionStore
from spawnkit.store.backend import redact_url

from .postgres import PASSWORD


def spawnkit(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spawnkit", *args], capture_output=True, text=True, timeout=120,
        check=False, env={**os.environ, **env},
    )  # fmt: skip


def record_sessions(target: str | Path, count: int) -> None:
    with SessionStore(target) as store:
        for n in range(count):
            store.create_session(
                f"s{n}", butler="general", runtime="codex", model=None, prompt="p",
                context=None, trigger_source="external",
            )  # fmt: skip
            store.complete_session(f"s{n}", SpawnerResult(output="x", success=True))


@pytest.fixture
def pg_store(postgres_url: str, isolated_home: Path) -> str:
    record_sessions(postgres_url, 3)
    record_sessions(isolated_home / "sessions.db", 1)  # the file a wrong command would read
    return postgres_url


def run_with_store(how: str, url: str, *command: str) -> subprocess.CompletedProcess[str]:
    """``command`` on the store ``url``, chosen by $SPAWNKIT_STORE, or --store before or
    after the (sub)command."""
    if how == "variable":
        return spawnkit(*command, SPAWNKIT_STORE=url)
    if how == "before":
        return spawnkit("--store", url, *command)
    return spawnkit(*command, "--store", url)


CHOICES = ["variable", "before", "after"]
PASSWORD_WARNING = "spawnkit: warning: the password in --store can be read by every user"


def errors(stderr: str) -> list[str]:
    """stderr's lines but the warning a password in --store gets (tested on its own)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith(PASSWORD_WARNING)]


@pytest.mark.parametrize("how", CHOICES)
def test_store_check_checks_the_chosen_postgresql_store(how: str, pg_store: str) -> None:
    done = run_with_store(how, pg_store, "store", "check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(f"{redact_url(pg_store)}: ok (schema ")
    assert done.stdout.strip().endswith(", 3 sessions)")
    assert PASSWORD not in done.stdout + done.stderr
    # A password on the command line is readable in the process list: said, not hidden.
    warned = PASSWORD_WARNING in done.stderr
    assert warned == (how != "variable"), done.stderr


@pytest.mark.parametrize("how", CHOICES)
def test_sessions_and_history_read_the_chosen_store(how: str, pg_store: str) -> None:
    listed = run_with_store(how, pg_store, "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["id"] for r in json.loads(listed.stdout)) == ["s0", "s1", "s2"]
    summed = run_with_store(how, pg_store, "history", "--by", "session", "--json")
    assert summed.returncode == 0, summed.stderr
    assert len(json.loads(summed.stdout)) == 3


@pytest.mark.parametrize("how", CHOICES)
def test_what_works_on_a_file_only_says_so_for_a_server(how: str, pg_store: str) -> None:
    for command, says in (
        (["store", "repair"], "`spawnkit store repair` works on a SQLite file"),
        (["store", "check", "--repair"], "`spawnkit store check` works on a SQLite file"),
        (["history", "import", "--source", "claude"], "keeps transcripts in a SQLite store"),
    ):
        done = run_with_store(how, pg_store, *command)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        (line,) = errors(done.stderr)
        assert line.startswith("spawnkit: error: ") and says in line, line
        assert redact_url(pg_store) in line and PASSWORD not in line


@pytest.mark.parametrize("how", CHOICES)
def test_a_store_file_chosen_is_the_one_checked(how: str, tmp_path: Path) -> None:
    chosen = tmp_path / "team.db"
    record_sessions(chosen, 2)
    done = run_with_store(how, str(chosen), "store", "check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{chosen}: ok (schema {_schema(chosen)}, 2 sessions)"
    assert not (Path(os.environ["SPAWNKIT_HOME"]) / "sessions.db").exists()


def _schema(path: Path) -> int:
    import sqlite3

    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
