"""Every library error at every CLI entry point is one line and exit code 2, never a traceback.

Each bad input below is run through the real ``spawnkit`` command line in a process of its
own. Read-only homes are real read-only mounts (a private mount namespace, so root cannot
write either) or, without root, folders without write permission.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spawnkit.config.credential_file import CredentialFile
from spawnkit.result import SpawnerResult
from spawnkit.store import SessionStore

from .conftest import REPO

ROSTER = REPO / "roster"
SCENARIO = ROSTER / "general" / "scenarios" / "assistant.toml"


def spawnkit(
    *args: str, cwd: Path = REPO, prefix: list[str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "spawnkit", *args],
        capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ),
        cwd=cwd, input=stdin,
    )  # fmt: skip


def assert_one_line(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("spawnkit: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


ReadOnly = Callable[[Path], list[str]]


@pytest.fixture
def read_only() -> Iterator[ReadOnly]:
    """Make a folder read-only: a command prefix (root) or its permissions (otherwise)."""
    changed: list[Path] = []

    def make(directory: Path) -> list[str]:
        if os.geteuid() != 0:
            directory.chmod(0o555)
            changed.append(directory)
            return []
        unshare = shutil.which("unshare")
        works = unshare and subprocess.run([unshare, "-m", "true"], check=False).returncode == 0
        if not works:
            pytest.skip("root without mount namespaces: no way to make a folder read-only")
        script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'
        return [str(unshare), "-m", "sh", "-c", script, str(directory)]

    yield make
    for directory in changed:
        directory.chmod(0o700)


def damage(db: Path) -> None:
    """Overwrite every page after the fourth (the header and schema stay readable)."""
    SessionStore(db).close()  # checkpointed: everything is in the main file
    size = db.stat().st_size
    assert size > 8 * 4096
    with open(db, "r+b") as fh:
        fh.seek(4 * 4096)
        fh.write(b"\xff" * (size - 5 * 4096))


def fill(db: Path, sessions: int = 200) -> None:
    CredentialFile.beside(db).set("GITHUB_TOKEN", "kept")
    with SessionStore(db) as store:
        for i in range(sessions):
            store.create_session(
                f"s{i:03d}", butler="general", runtime="codex", model=None, prompt="p" * 200,
                context=None, trigger_source="external",
            )  # fmt: skip
            store.complete_session(f"s{i:03d}", SpawnerResult(output="x" * 500, success=True))


BadInput = Callable[[Path], subprocess.CompletedProcess[str]]


def _run(*extra: str) -> tuple[str, ...]:
    return ("run", "--roster", str(ROSTER), "--butler", "general", "--replay", str(SCENARIO),
            *extra)  # fmt: skip


def _with_source(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "notes").mkdir()
    assert spawnkit("sources", "add", "notes", str(tmp / "notes")).returncode == 0
    return spawnkit(*args, stdin="what\x00now" if "-" in args else None)


def _nul_file(tmp: Path) -> Path:
    path = tmp / "nul.txt"
    path.write_bytes(b"log my\x00weight")
    return path


def _roster_with(tmp: Path, butler_toml: bytes, claude_md: bytes = b"Be brief.") -> Path:
    folder = tmp / "roster" / "broken"
    folder.mkdir(parents=True)
    (folder / "butler.toml").write_bytes(butler_toml)
    (folder / "CLAUDE.md").write_bytes(claude_md)
    return folder


GOOD_TOML = b'[butler]\nname = "broken"\nport = 18999\n'
LATIN1_TOML = GOOD_TOML + b"# caf\xe9\n"  # "café" in Latin-1: 0xe9 is no UTF-8 sequence
LATIN1_PROMPT = b"You are the caf\xe9 butler.\n"


def _latin1_butler_toml(tmp: Path) -> subprocess.CompletedProcess[str]:
    folder = _roster_with(tmp, LATIN1_TOML)
    return spawnkit("roster", "--roster", str(folder.parent))


def _latin1_claude_md(tmp: Path) -> subprocess.CompletedProcess[str]:
    folder = _roster_with(tmp, GOOD_TOML, claude_md=LATIN1_PROMPT)
    return spawnkit("roster", "--roster", str(folder.parent))


CASES: dict[str, tuple[BadInput, tuple[str, ...]]] = {
    "empty prompt": (lambda tmp: spawnkit(*_run("")), ("the prompt is empty",)),
    "blank prompt on stdin": (
        lambda tmp: spawnkit(*_run("-"), stdin="  \n"),
        ("the prompt is empty",),
    ),
    "max-turns 0": (
        lambda tmp: spawnkit(*_run("--max-turns", "0", "hi")),
        ("max_turns must be at least 1",),
    ),
    "missing prompt file": (
        lambda tmp: spawnkit(*_run(f"@{tmp / 'nope.txt'}")),
        ("cannot read the prompt file", "nope.txt"),
    ),
    "unknown runtime for one run": (
        lambda tmp: spawnkit(*_run("--runtime", "gpt", "hi")),
        ("unknown runtime 'gpt'", "claude-code (or claude)"),
    ),
    "no roster anywhere": (
        lambda tmp: spawnkit("roster", cwd=tmp),
        ("no roster found", "./roster", "$SPAWNKIT_HOME/roster", "spawnkit init"),
    ),
    "init into a folder with content": (
        lambda tmp: spawnkit("init", str(REPO / "roster")),
        ("not an empty folder",),
    ),
    "adapter with an unknown runtime": (
        lambda tmp: spawnkit("adapter", "gpt", "capabilities"),
        ("unknown runtime 'gpt'",),
    ),
    "ask with an unknown runtime": (
        lambda tmp: _with_source(tmp, "ask", "--sources", "notes", "--runtime", "gpt", "q"),
        ("unknown runtime 'gpt'", "claude-code (or claude)"),
    ),
    "history since a non-date": (
        lambda tmp: spawnkit("history", "--since", "notadate"),
        ("'notadate' is not a date",),
    ),
    "store check of a missing file": (
        lambda tmp: spawnkit("store", "check", str(tmp / "nope.db")),
        ("no session store at",),
    ),
    "chat without a terminal": (
        lambda tmp: spawnkit("chat", "--sources", "x", stdin=""),
        ("needs a terminal",),
    ),
    "butler.toml not UTF-8": (
        _latin1_butler_toml,
        (
            f"broken/butler.toml: not UTF-8 text (byte 0xe9 at offset {LATIN1_TOML.index(0xE9)})",
            "save it as UTF-8",
        ),
    ),
    "CLAUDE.md not UTF-8": (
        _latin1_claude_md,
        (f"broken/CLAUDE.md: not UTF-8 text (byte 0xe9 at offset {LATIN1_PROMPT.index(0xE9)})",),
    ),
    "sessions -n beyond any store's range": (
        lambda tmp: spawnkit("sessions", "-n", "100000000000000000000"),
        ("argument -n/--limit: must be from 1 to 1000000", "spawnkit sessions --help"),
    ),
    "sessions -n 0": (
        lambda tmp: spawnkit("sessions", "-n", "0"),
        ("argument -n/--limit: must be from 1 to 1000000, not 0",),
    ),
    "history -n negative": (
        lambda tmp: spawnkit("history", "-n", "-5"),
        ("argument -n/--limit: must be from 1 to 1000000, not -5",),
    ),
    "store URL of an unsupported scheme": (
        lambda tmp: spawnkit("sessions", "--store", "mysql://x/y", cwd=tmp),
        (
            "unsupported session store 'mysql://x/y'",
            "a SQLite file path",
            "postgresql:// (or postgres://)",
        ),
    ),
    "store URL of an unsupported scheme, as a global option": (
        lambda tmp: spawnkit("--store", "sqlite:///x.db", "sessions", cwd=tmp),
        ("unsupported session store 'sqlite:///x.db'",),
    ),
    **{
        f"run {option} {value}": (
            lambda tmp, option=option, value=value: spawnkit(*_run(option, value, "hi")),
            (f"argument {option}: must be a finite number above 0, not '{value}'",),
        )
        for option in ("--timeout-s", "--max-cost-usd")
        for value in ("inf", "nan", "0", "-1")
    },
    "NUL byte in a prompt on stdin": (
        lambda tmp: spawnkit(*_run("-"), stdin="weigh\x00this"),
        ("the prompt contains a NUL byte (at character 5)",),
    ),
    "NUL byte in a prompt file": (
        lambda tmp: spawnkit(*_run(f"@{_nul_file(tmp)}")),
        ("the prompt contains a NUL byte",),
    ),
    "NUL byte in the context": (
        lambda tmp: spawnkit(*_run("--context", f"@{_nul_file(tmp)}", "hi")),
        ("the context contains a NUL byte",),
    ),
    "NUL byte in a question": (
        lambda tmp: _with_source(tmp, "ask", "--sources", "notes", "-"),
        ("the question contains a NUL byte",),
    ),
    **{
        f"run --on {address}": (
            lambda tmp, address=address: spawnkit(*_run("--on", address, "hi")),
            (f"{address!r} is not a Dask scheduler's address ({why})", "tcp://host:8786"),
        )
        for address, why in (
            ("notanaddress", "it has no port"),
            ("tcp://127.0.0.1", "it has no port"),
            ("http://127.0.0.1:8786", "the scheme http:// is not tcp:// or tls://"),
            ("tcp://127.0.0.1:port", "it is not host:port"),
        )
    },
    "run --timeout-s not a number": (
        lambda tmp: spawnkit(*_run("--timeout-s", "soon", "hi")),
        ("argument --timeout-s: 'soon' is not a number",),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_input_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    make, fragments = CASES[case]
    assert_one_line(make(tmp_path), *fragments)
    assert SessionStore().count_sessions() == 0, "nothing was accepted"
    assert not (tmp_path / "mysql:").exists() and not (tmp_path / "sqlite:").exists()


def test_a_store_given_as_a_plain_path_still_works(tmp_path: Path) -> None:
    done = spawnkit("sessions", "--store", "plain.db", "-n", "1000000", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "plain.db").is_file()


def test_chat_without_a_terminal_checks_that_before_the_sources(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    assert spawnkit("sources", "add", "notes", str(notes)).returncode == 0
    line = assert_one_line(
        spawnkit("chat", "--sources", "notes", "--replay", str(SCENARIO), stdin="hi\n"),
        "needs a terminal", "spawnkit ask",
    )  # fmt: skip
    assert "--print" not in line


@pytest.mark.parametrize("command", ["run", "sessions"])
def test_a_damaged_store_names_the_file_and_the_way_out(command: str, isolated_home: Path) -> None:
    db = isolated_home / "sessions.db"
    fill(db)
    damage(db)
    args = _run("hi") if command == "run" else ("sessions",)
    assert_one_line(
        spawnkit(*args), f"the session store {db} is damaged", "spawnkit store check --repair"
    )


def test_store_check_repair_keeps_every_readable_row_and_the_credentials(
    isolated_home: Path,
) -> None:
    db = isolated_home / "sessions.db"
    fill(db)
    with open(db, "r+b") as fh:  # one leaf page of the sessions table
        fh.seek(60 * 4096)
        fh.write(b"\xff" * 4096)
    checked = spawnkit("store", "check")
    assert checked.returncode == 1 and "spawnkit store check --repair" in checked.stderr
    repaired = spawnkit("store", "check", "--repair")
    assert repaired.returncode == 1, repaired.stderr  # rows were lost: it says so
    assert "sessions" in repaired.stdout and "LOST" in repaired.stdout
    backups = list(isolated_home.glob("sessions.db.damaged-*"))
    assert len([b for b in backups if not b.name.endswith(("-wal", "-shm"))]) == 1
    # The credentials live in their own file: the store's damage never reached them.
    assert CredentialFile.beside(db).get("GITHUB_TOKEN") == "kept"
    with SessionStore(db) as store:
        kept = store.count_sessions()
    assert 150 < kept < 200
    assert spawnkit("store", "check").returncode == 0
    again = spawnkit("store", "check", "--repair")
    assert again.returncode == 0 and "nothing to repair" in again.stdout


def test_losing_credentials_in_a_repair_is_never_silent(isolated_home: Path) -> None:
    """A store from before the credentials file, damaged before it could move them out."""
    db = isolated_home / "sessions.db"
    fill(db, sessions=5)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(
        "CREATE TABLE credentials (name TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at TEXT)"
    )
    conn.executemany(
        "INSERT INTO credentials VALUES (?, ?, '2026-01-01T00:00:00+00:00')",
        [(f"TOKEN_{i}", "v" * 300) for i in range(40)],
    )
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'credentials'").fetchone()[
        0
    ]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(db, "r+b") as fh:
        fh.seek((root - 1) * 4096)
        fh.write(b"\xff" * 4096)
    repaired = spawnkit("store", "check", "--repair")
    assert repaired.returncode == 1
    assert "some rows of 'credentials' could not be read" in repaired.stderr
    assert "credentials  LOST" in repaired.stdout


def test_a_read_only_home(isolated_home: Path, read_only: ReadOnly) -> None:
    SessionStore().close()
    prefix = read_only(isolated_home)
    for args in (_run("hi"), ("sessions",)):
        assert_one_line(
            spawnkit(*args, prefix=prefix), f"{isolated_home} is read-only", "SPAWNKIT_HOME"
        )
    stored = spawnkit("credentials", "set", "GITHUB_TOKEN", stdin="value\n", prefix=prefix)
    assert_one_line(stored, str(isolated_home), "read-only")
    listed = spawnkit("credentials", "list", prefix=prefix)  # reading needs no writes
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr


def test_a_home_that_cannot_be_created_under_a_read_only_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_only: ReadOnly
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    home = locked / "state" / "spawnkit"
    monkeypatch.setenv("SPAWNKIT_HOME", str(home))
    prefix = read_only(locked)
    for args in (_run("hi"), ("sessions",), ("history",)):
        assert_one_line(spawnkit(*args, prefix=prefix), f"{home} is read-only", "SPAWNKIT_HOME")


def test_history_reads_a_read_only_home(isolated_home: Path, read_only: ReadOnly) -> None:
    fill(isolated_home / "sessions.db", sessions=3)
    done = spawnkit("history", "--by", "group", "--json", prefix=read_only(isolated_home))
    assert done.returncode == 0, done.stderr
    assert '"butler": "general"' in done.stdout and '"sessions": 3' in done.stdout
    assert done.stderr == ""


def test_an_unreachable_scheduler_is_one_line_and_no_record(tmp_path: Path) -> None:
    """Nothing listens there: refused once the connection attempt gives up (5 s), before
    the run is accepted, so it is never said to be queued and leaves no record."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    done = spawnkit(*_run("--on", address, "hi"), cwd=tmp_path)
    assert_one_line(done, f"cannot reach the Dask scheduler at {address} within 5 s")
    assert "queued" not in done.stdout, done.stdout
    assert SessionStore().count_sessions() == 0
