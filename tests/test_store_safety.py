"""Reading history never corrupts the store, and `spawnkit store check` tells healthy from damaged.

The sequence that corrupted stores (issue 13), with real processes: process A keeps a
SessionStore open and reads ``history.sessions()`` from the same file; process B
(``spawnkit sessions``) opens and closes the store; then A and a third process write at
the same time. With a second SQLite library in A, B's close deleted the live WAL and the
file ended up "malformed". Both of history's read paths (in-process ``sqlite3`` for small
stores, ADBC in a child process for large ones) are run through it.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from spawnkit import history
from spawnkit.errors import StoreDamaged
from spawnkit.history import store_query
from spawnkit.result import SpawnerResult, ToolCall
from spawnkit.store import SCHEMA_VERSION, SessionStore, check_store

WRITES = 200

PROCESS_A = """
import subprocess, sys
from pathlib import Path
from spawnkit import history
from spawnkit.history import store_query
from spawnkit.result import SpawnerResult
from spawnkit.store import SessionStore

db, child_min_bytes, writer = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
store_query.CHILD_MIN_BYTES = child_min_bytes

def add(store, name):
    store.create_session(name, butler="b", runtime="claude-code", model=None, prompt="p",
                         context=None, trigger_source="external")
    store.complete_session(name, SpawnerResult(output="x" * 1000, success=True))

store = SessionStore(db)
for i in range(50):
    add(store, f"a{i}")
assert len(history.sessions(store)) == 50          # 1. read history, store still open
subprocess.run([sys.executable, "-m", "spawnkit", "sessions"], check=True,
               stdout=subprocess.DEVNULL)          # 2. another process opens and closes it
print("wal after B:", db.with_name(db.name + "-wal").exists(), flush=True)
other = subprocess.Popen([sys.executable, writer, str(db)])   # 3. both write at once
for i in range(50, 50 + {writes}):
    add(store, f"a{i}")
assert other.wait(timeout=120) == 0
store.close()
"""

WRITER = """
import sys
from spawnkit.result import SpawnerResult
from spawnkit.store import SessionStore

store = SessionStore(sys.argv[1])
for i in range({writes}):
    store.create_session(f"c{i}", butler="b", runtime="codex", model=None, prompt="p",
                         context=None, trigger_source="external")
    store.complete_session(f"c{i}", SpawnerResult(output="y" * 1000, success=True))
store.close()
"""


@pytest.mark.parametrize("read_path", ["in-process", "child"])
def test_reading_history_while_the_store_is_open_keeps_it_intact(
    tmp_path: Path, read_path: str
) -> None:
    db = tmp_path / "state" / "sessions.db"
    db.parent.mkdir()
    script = tmp_path / "a.py"
    script.write_text(textwrap.dedent(PROCESS_A.replace("{writes}", str(WRITES))))
    writer = tmp_path / "writer.py"
    writer.write_text(textwrap.dedent(WRITER.replace("{writes}", str(WRITES))))
    threshold = 0 if read_path == "child" else 1 << 40
    done = subprocess.run(
        [sys.executable, str(script), str(db), str(threshold), str(writer)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The live WAL survived the other process's close: it still had a reader/writer.
    assert "wal after B: True" in done.stdout

    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 50 + 2 * WRITES
    finally:
        conn.close()
    check = subprocess.run(
        [sys.executable, "-m", "spawnkit", "store", "check", str(db)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert f"ok (schema {SCHEMA_VERSION}, {50 + 2 * WRITES} sessions)" in check.stdout


def _filled_store(path: Path, sessions: int = 30) -> None:
    with SessionStore(path) as store:
        for i in range(sessions):
            sid = f"s{i:03d}"
            store.create_session(
                sid, butler=("health", "general")[i % 2], runtime=("codex", "gemini")[i % 2],
                model="claude-sonnet-4-5" if i % 3 else None, prompt=f"prompt {i}",
                context=None, trigger_source="external", role="researcher" if i % 4 else None,
            )  # fmt: skip
            if i % 5 == 4:
                continue  # left open: nulls in every result column
            call = ToolCall.start(f"t{i}", "mcp__health__state_get", {"key": "k"}, _at(i))
            result = SpawnerResult(
                output="done", success=i % 7 != 0, tool_calls=[call.finish("v", False, _at(i))],
                cost_usd=None if i % 2 else 0.25, duration_ms=100 + i,
            )  # fmt: skip
            store.complete_session(sid, result)


def _at(i: int) -> pd.Timestamp:
    return pd.Timestamp("2026-11-01T10:00:00Z") + pd.Timedelta(minutes=i)


def test_both_read_paths_give_the_same_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "sessions.db"
    _filled_store(db)
    monkeypatch.setattr(store_query, "CHILD_MIN_BYTES", 1 << 40)
    local = (history.sessions(db), history.tool_calls(db, output=True))
    monkeypatch.setattr(store_query, "CHILD_MIN_BYTES", 0)
    child = (history.sessions(db), history.tool_calls(db, output=True))
    for a, b in zip(local, child, strict=True):
        pd.testing.assert_frame_equal(a, b)
    assert len(local[0]) == 30
    assert local[0]["success"].isna().sum() == 6
    created = local[0]["created_at"].dtype
    assert isinstance(created, pd.DatetimeTZDtype)
    assert str(created.tz) == "UTC"


@pytest.mark.parametrize("reader", ["in process", "child"])
def test_history_on_a_damaged_store_gives_the_repair_hint_the_cli_gives(
    reader: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "sessions.db"
    _filled_store(db, sessions=200)
    _damage(db)
    monkeypatch.setattr(store_query, "CHILD_MIN_BYTES", 0 if reader == "child" else 1 << 40)
    cli = subprocess.run(
        [sys.executable, "-m", "spawnkit", "--store", str(db), "sessions"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 2
    (line,) = cli.stderr.strip().splitlines()
    assert f"spawnkit store check --repair {db}" in line
    for read in (history.sessions, history.tool_calls, history.usage):
        with pytest.raises(StoreDamaged) as info:
            read(db)
        assert info.value.path == db
        if reader == "in process":  # the same SQLite library: the same words
            assert line == f"spawnkit: error: {info.value}"
        else:  # ADBC words the damage its own way; the way out is the same
            assert line.split("): ", 1)[1] == str(info.value).split("): ", 1)[1]


def _damage(db: Path) -> None:
    """Overwrite pages in the middle of the file (the first page, the header, stays)."""
    SessionStore(db).close()  # checkpointed: everything is in the main file
    size = db.stat().st_size
    assert size > 8 * 4096
    with open(db, "r+b") as fh:
        fh.seek(4 * 4096)
        fh.write(b"\xff" * (size - 5 * 4096))


def test_store_check_tells_a_damaged_store_from_a_healthy_one(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    _filled_store(db, sessions=200)
    healthy = check_store(db)
    assert healthy.healthy
    assert healthy.sessions == 200
    _damage(db)
    damaged = check_store(db)
    assert not damaged.healthy
    assert damaged.problems
    cli = subprocess.run(
        [sys.executable, "-m", "spawnkit", "store", "check", str(db)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 1
    assert f"{db}: damaged" in cli.stderr
    missing = check_store(tmp_path / "nothing.db")
    assert not missing.healthy
    assert "does not exist" in missing.problems[0]
