"""Credentials at rest: a 0600 file of their own, the move out of old stores, the CLI."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import pwd
import select
import sqlite3
import stat
import subprocess
import sys
import termios
import time
from datetime import datetime
from pathlib import Path

import pytest

from spawnkit.config.credential_file import (
    CredentialError,
    CredentialFile,
    StoredCredential,
    validate_name,
)
from spawnkit.containment.credentials import CredentialStore
from spawnkit.errors import StoreDamaged
from spawnkit.store import SessionStore

from .conftest import REPO

SECRET = "canary-4f1d9b77e2"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def spawnkit(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spawnkit", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONWARNINGS": "always", **env}, cwd=REPO,
    )  # fmt: skip


def one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("spawnkit: error: ")
    for fragment in fragments:
        assert fragment in line
    return line


# -- the file ------------------------------------------------------------------------------------


def test_set_get_replace_delete(tmp_path: Path) -> None:
    file = CredentialFile(tmp_path / "credentials.json")
    assert file.get("API_TOKEN") is None and file.names() == []
    file.set("API_TOKEN", "first value")
    file.set("ANOTHER", "x")
    file.set("API_TOKEN", "second 'value' $HOME é\nline two")
    assert CredentialFile(file.path).get("API_TOKEN") == "second 'value' $HOME é\nline two"
    assert file.names() == ["ANOTHER", "API_TOKEN"]
    assert file.delete("API_TOKEN") is True and file.delete("API_TOKEN") is False
    assert file.get("API_TOKEN") is None and file.names() == ["ANOTHER"]
    document = json.loads(file.path.read_text())
    assert document["format"] == 1 and set(document["credentials"]) == {"ANOTHER"}


@pytest.mark.parametrize("name", ["MY KEY", "1TOKEN", "TOKEN-X", "", "A=B", "ÉTÉ"])
def test_names_must_be_variable_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(CredentialError, match="invalid credential name"):
        CredentialFile(tmp_path / "c.json").set(name, "value")
    assert not (tmp_path / "c.json").exists()
    assert validate_name("_Ok_9") == "_Ok_9"


@pytest.mark.parametrize(("value", "problem"), [("", "empty"), ("a\0b", "NUL")])
def test_values_a_variable_cannot_hold_are_refused(
    tmp_path: Path, value: str, problem: str
) -> None:
    with pytest.raises(CredentialError, match=problem):
        CredentialFile(tmp_path / "c.json").set("TOKEN", value)


def test_file_and_home_permissions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "fresh" / "spawnkit"
    monkeypatch.setenv("SPAWNKIT_HOME", str(home))
    old = os.umask(0)  # the most permissive umask: modes must not depend on it
    try:
        file = CredentialFile.default()
        file.set("TOKEN", SECRET)
    finally:
        os.umask(old)
    assert file.path == home / "credentials.json"
    assert mode(home) == 0o700 and mode(file.path) == 0o600
    assert mode(home / ".credentials.lock") == 0o600
    file.set("OTHER", "value-two")
    assert mode(file.path) == 0o600
    assert sorted(p.name for p in home.iterdir()) == [".credentials.lock", "credentials.json"]


@pytest.mark.parametrize("loose", [0o644, 0o640, 0o604, 0o660, 0o602, 0o610], ids=oct)
def test_a_file_others_may_read_or_write_is_refused_until_chmod_600(
    tmp_path: Path, loose: int
) -> None:
    """As ssh refuses such a private key: refused for reading and writing alike, with the
    command that fixes it, and left as it is."""
    path = tmp_path / "credentials.json"
    CredentialFile(path).set("TOKEN", SECRET)
    path.chmod(loose)
    before = path.read_bytes()
    fix = f"run `chmod 600 {path}`"

    for use in (
        lambda file: file.get("TOKEN"),
        lambda file: file.names(),
        lambda file: file.set("OTHER", "value"),
        lambda file: CredentialStore(file=file, environ={}).resolve("TOKEN"),
    ):
        with pytest.raises(CredentialError) as refused:
            use(CredentialFile(path))
        assert str(refused.value) == (
            f"the credentials file {path} is open to other users (mode {loose:o}): {fix}"
        )
    assert path.read_bytes() == before and mode(path) == loose

    path.chmod(0o600)
    assert CredentialStore(file=CredentialFile(path), environ={}).resolve("TOKEN") == SECRET


def test_a_file_that_turns_loose_after_a_read_is_refused(tmp_path: Path) -> None:
    """A chmod changes no size or mtime: what the file object remembers is not trusted."""
    file = CredentialFile(tmp_path / "credentials.json")
    file.set("TOKEN", SECRET)
    assert file.get("TOKEN") == SECRET
    file.path.chmod(0o644)
    with pytest.raises(CredentialError, match="chmod 600"):
        file.get("TOKEN")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to user nobody")
def test_a_file_another_user_owns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    CredentialFile(path).set("TOKEN", SECRET)
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(path, nobody, -1)
    with pytest.raises(CredentialError) as refused:
        CredentialFile(path).get("TOKEN")
    message = str(refused.value)
    assert message.startswith(f"the credentials file {path} belongs to another user (uid {nobody})")
    assert f"chown {os.geteuid()} {path} && chmod 600 {path}" in message


def test_the_cli_refuses_a_loose_file_in_one_line(isolated_home: Path) -> None:
    CredentialFile.default().set("TOKEN", SECRET)
    path = isolated_home / "credentials.json"
    path.chmod(0o644)
    line = one_line_error(spawnkit("credentials", "list"), f"run `chmod 600 {path}`")
    assert SECRET not in line
    path.chmod(0o600)
    done = spawnkit("credentials", "list")
    assert (done.returncode, done.stdout) == (0, "TOKEN\n"), done.stderr


def test_a_damaged_file_is_reported_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text('{"credentials": {"TOKEN": {"value": "kept"')
    path.chmod(0o600)
    file = CredentialFile(path)
    with pytest.raises(CredentialError, match="cannot read the credentials file"):
        file.get("TOKEN")
    with pytest.raises(CredentialError, match="fix or move it away"):
        file.set("OTHER", "value")
    assert path.read_text() == '{"credentials": {"TOKEN": {"value": "kept"'


WRITER = """
import sys
from pathlib import Path
from spawnkit.config.credential_file import CredentialFile
file = CredentialFile(Path(sys.argv[1]))
for i in range(int(sys.argv[3])):
    file.set(f"{sys.argv[2]}_{i}", f"value-{sys.argv[2]}-{i}")
"""


def test_concurrent_writers_in_several_processes_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"P{n}", "15"]) for n in range(4)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0, 0]
    stored = CredentialFile(path).load()
    assert len(stored) == 60
    assert all(entry.value == f"value-{name.replace('_', '-')}" for name, entry in stored.items())
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_held_lock_times_out_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spawnkit.config import credential_file

    monkeypatch.setattr(credential_file, "LOCK_TIMEOUT_S", 0.2)
    file = CredentialFile(tmp_path / "credentials.json")
    file.set("FIRST", "value-one")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(30)", str(tmp_path / ".credentials.lock")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(CredentialError, match="locked by another process"):
            file.set("SECOND", "value-two")
        assert file.get("FIRST") == "value-one", "readers take no lock"
    finally:
        holder.kill()
        holder.wait(timeout=10)


# -- moving credentials out of an old store -------------------------------------------------------

OLD_TABLE = (
    "CREATE TABLE credentials (name TEXT PRIMARY KEY, value TEXT NOT NULL, "
    "updated_at TEXT NOT NULL)"
)


def old_store(path: Path, rows: dict[str, tuple[str, str]]) -> None:
    """A store as spawnkit 0.x left it: the credentials table, written in WAL mode."""
    SessionStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(OLD_TABLE)
    conn.executemany(
        "INSERT INTO credentials VALUES (?, ?, ?)",
        [(name, value, at) for name, (value, at) in rows.items()],
    )
    conn.commit()
    conn.close()


def store_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(f"{path.name}*"))


def test_old_credentials_move_to_the_file_and_leave_the_store(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    old_store(
        db, {"GITHUB_TOKEN": (SECRET, "2026-01-02T03:04:05+00:00"), "LEGACY NAME": ("v" * 9, "")}
    )
    assert SECRET.encode() in store_bytes(db)

    with SessionStore(db) as store:
        assert CredentialStore(store, {}).resolve("GITHUB_TOKEN") == SECRET
        tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master")}
        assert "credentials" not in tables
    file = CredentialFile.beside(db)
    assert file.names() == ["GITHUB_TOKEN", "LEGACY NAME"], "even a name we would now refuse"
    assert mode(file.path) == 0o600
    assert SECRET.encode() not in store_bytes(db), (
        "the value left the file's pages, not just the table"
    )

    before = file.path.read_bytes()
    SessionStore(db).close()  # idempotent: nothing left to move, nothing rewritten
    assert file.path.read_bytes() == before


def test_a_crash_between_writing_the_file_and_dropping_the_table_is_repaired(
    tmp_path: Path,
) -> None:
    db = tmp_path / "sessions.db"
    old_store(
        db,
        {
            "A_TOKEN": (SECRET, "2026-01-01T00:00:00+00:00"),
            "B_TOKEN": ("bbbbbbbbbb", "2026-01-01T00:00:00+00:00"),
        },
    )
    file = CredentialFile.beside(db)
    # The state a crash after the merge leaves: the file written, the table still there.

    file.merge(
        [StoredCredential("A_TOKEN", SECRET, datetime.fromisoformat("2026-01-01T00:00:00+00:00"))]
    )
    file.set("B_TOKEN", "set-after-the-crash")  # newer than the table's value: it wins
    with SessionStore(db):
        pass
    assert file.get("A_TOKEN") == SECRET and file.get("B_TOKEN") == "set-after-the-crash"
    assert SECRET.encode() not in store_bytes(db)


def corrupt_table(db: Path, table: str) -> None:
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    conn.close()
    with open(db, "r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(b"\xa5" * page_size)


def test_a_damaged_credentials_table_is_reported_and_kept(tmp_path: Path, caplog) -> None:
    db = tmp_path / "sessions.db"
    old_store(db, {"GITHUB_TOKEN": (SECRET, "2026-01-02T03:04:05+00:00")})
    corrupt_table(db, "credentials")
    with caplog.at_level(logging.WARNING, logger="spawnkit.store"):
        SessionStore(db).close()  # the rest of the store still opens
    (warning,) = [r.getMessage() for r in caplog.records if "credentials" in r.getMessage()]
    assert "could not move the credentials" in warning and "stay in the store" in warning
    assert not CredentialFile.beside(db).path.exists(), "nothing half-written"
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'credentials'").fetchone()


def test_a_store_damaged_elsewhere_still_gives_up_its_credentials(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    old_store(db, {"GITHUB_TOKEN": (SECRET, "2026-01-02T03:04:05+00:00")})
    conn = sqlite3.connect(db)
    conn.executemany(
        "INSERT INTO sessions (id, butler, runtime, prompt, trigger_source, status, created_at) "
        "VALUES (?, 'b', 'codex', ?, 'external', 'success', '2026-01-01')",
        [(f"s{i}", "p" * 500) for i in range(40)],
    )
    conn.commit()
    conn.close()
    corrupt_table(db, "sessions")
    with SessionStore(db) as store, pytest.raises(StoreDamaged, match="is damaged"):
        store.list_sessions()
    assert CredentialFile.beside(db).get("GITHUB_TOKEN") == SECRET


# -- the command line ------------------------------------------------------------------------------


def test_set_reads_a_pipe_without_warnings_and_list_never_prints_values() -> None:
    done = spawnkit("credentials", "set", "GITHUB_TOKEN", stdin=SECRET + "\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", "no GetPassWarning, no prompt"
    assert SECRET not in done.stdout
    assert CredentialFile.default().get("GITHUB_TOKEN") == SECRET, "one trailing newline dropped"
    multi = spawnkit("credentials", "set", "PEM_KEY", stdin="line one\nline two\n")
    assert multi.returncode == 0 and CredentialFile.default().get("PEM_KEY") == "line one\nline two"

    listing = spawnkit("credentials", "list")
    assert listing.stdout.split() == ["GITHUB_TOKEN", "PEM_KEY"]
    assert SECRET not in listing.stdout + listing.stderr and "line one" not in listing.stdout
    assert spawnkit("credentials", "delete", "PEM_KEY").returncode == 0
    assert spawnkit("credentials", "list").stdout.split() == ["GITHUB_TOKEN"]
    one_line_error(spawnkit("credentials", "delete", "PEM_KEY"), "no stored credential")


def test_bad_names_and_values_are_one_line_errors() -> None:
    line = one_line_error(spawnkit("credentials", "set", "MY KEY", stdin="value-long"), "MY_KEY")
    assert "invalid credential name 'MY KEY'" in line
    one_line_error(spawnkit("credentials", "delete", "MY KEY"), "invalid credential name")
    one_line_error(spawnkit("credentials", "set", "EMPTY", stdin=""), "empty")
    one_line_error(spawnkit("credentials", "set", "NEWLINE_ONLY", stdin="\n"), "empty")
    assert not CredentialFile.default().path.exists(), "nothing was stored"


def test_a_value_on_the_command_line_works_with_a_note() -> None:
    done = spawnkit("credentials", "set", "ARG_TOKEN", SECRET)
    assert done.returncode == 0 and "process list" in done.stderr and SECRET not in done.stderr
    assert CredentialFile.default().get("ARG_TOKEN") == SECRET


def test_set_on_a_terminal_prompts_without_echo() -> None:
    """On a terminal the value is asked for (getpass), and not echoed."""
    controller, terminal = pty.openpty()

    def take_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    child = subprocess.Popen(
        [sys.executable, "-m", "spawnkit", "credentials", "set", "TTY_TOKEN"],
        stdin=terminal, stdout=terminal, stderr=terminal, cwd=REPO, start_new_session=True,
        preexec_fn=take_terminal,
    )  # fmt: skip
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"TTY_TOKEN: " not in seen and time.monotonic() < deadline:
            if select.select([controller], [], [], 1)[0]:
                seen += os.read(controller, 1024)
        os.write(controller, SECRET.encode() + b"\n")
        assert child.wait(timeout=60) == 0
        while select.select([controller], [], [], 0.2)[0]:
            try:
                seen += os.read(controller, 1024)
            except OSError:
                break
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(controller)
    assert b"TTY_TOKEN: " in seen and b"stored TTY_TOKEN" in seen
    assert SECRET.encode() not in seen, "the typed value is not echoed"
    assert b"Warning" not in seen
    assert CredentialFile.default().get("TTY_TOKEN") == SECRET


def test_the_cli_moves_an_old_stores_credentials(isolated_home: Path) -> None:
    old_store(isolated_home / "sessions.db", {"OLD_TOKEN": (SECRET, "2026-01-02T03:04:05+00:00")})
    assert spawnkit("credentials", "list").stdout.split() == ["OLD_TOKEN"]
    assert SECRET.encode() not in store_bytes(isolated_home / "sessions.db")
