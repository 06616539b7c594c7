"""`spawnkit store migrate --to URL`: a SQLite history copied into a real PostgreSQL, once.

Every table the two engines share is filled in the SQLite file; after the copy each record
reads back identically from the server, a second run copies nothing, and what the server
held before (another host's rows) is left as it was.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from spawnkit.store import SessionStore
from spawnkit.store import migrate as store_migrate
from spawnkit.store.backend import redact_url

from .postgres import PASSWORD
from .test_cli import assert_one_line_error, spawnkit
from .test_store import T0, create, full_result

TABLES = ("sessions", "tool_calls", "mcp_calls", "state", "episodes", "cli_spans", "cli_events")


def _fill(db: Path) -> None:
    with SessionStore(db) as store:
        create(store, "s-1", created_at=T0, runtime_session_id="rt-1")
        store.complete_session("s-1", full_result(), completed_at=T0 + timedelta(seconds=9))
        create(store, "s-2", created_at=T0 + timedelta(minutes=1), parent_session_id="s-1")
        store.complete_session("s-2", full_result(session_id="s-2", tool_calls=[]))
        store.record_mcp_call(
            butler="health", session_key="rt-1", tool="state_set", arguments={"key": "w"},
            result="ok", is_error=False, called_at=T0, duration_ms=3,
        )  # fmt: skip
        store.record_mcp_call(
            butler="health", session_key=None, tool="state_get", arguments={},
            result="none", is_error=True, called_at=T0, duration_ms=1,
        )  # fmt: skip
        store.state_set("health", "weight", {"kg": 71.2})
        store.state_set("health", "shared", "from sqlite")
        store.add_episode("health", "s-1", "how much?", "71.2 kg")
        store.add_episode("health", "s-2", "and now?", "71.0 kg")
        span = {
            "session_id": "s-1", "trace_id": "t" * 32, "span_id": "a" * 16,
            "parent_span_id": None, "name": "claude_code.tool", "service": "claude-code",
            "start_ns": 1, "end_ns": 2, "status": "ok", "attributes": {"tool": "Bash"},
            "reparented": True,
        }  # fmt: skip
        store.record_cli_spans([span, {**span, "span_id": "b" * 16, "parent_span_id": "a" * 16}])
        event = {
            "session_id": "s-1", "kind": "log", "name": "api_request", "service": "claude-code",
            "time_ns": 5, "trace_id": None, "span_id": None, "value": None,
            "attributes": {"model": "claude-sonnet-4-5"},
        }  # fmt: skip
        store.record_cli_events(
            [event, {**event, "kind": "metric", "name": "tokens", "value": 3.0}]
        )


def _counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {
            t: conn.execute(f"SELECT count(*) FROM spawnkit.{t}").fetchone()[0]  # type: ignore[index]
            for t in TABLES
        }


def _report(stdout: str) -> dict[str, tuple[int, int, int]]:
    found = re.findall(r"^  (\w+) +(\d+) rows: (\d+) copied, (\d+) already there; verified$",
                       stdout, re.MULTILINE)  # fmt: skip
    return {name: (int(a), int(b), int(c)) for name, a, b, c in found}


def test_a_sqlite_history_is_copied_once_and_verified(tmp_path: Path, postgres_url: str) -> None:
    db = tmp_path / "sessions.db"
    _fill(db)
    with SessionStore(postgres_url) as server:  # another host wrote here first
        server.state_set("health", "shared", "from the server")
        server.add_episode("health", None, "other host", "its answer")

    done = spawnkit("store", "migrate", "--to", postgres_url, str(db))
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == f"{db} -> {redact_url(postgres_url)}"
    assert _report(done.stdout) == {
        "sessions": (2, 2, 0), "tool_calls": (2, 2, 0), "mcp_calls": (2, 2, 0),
        "state": (2, 1, 1), "episodes": (2, 2, 0), "cli_spans": (2, 2, 0),
        "cli_events": (2, 2, 0),
    }  # fmt: skip
    assert _counts(postgres_url) == {
        "sessions": 2, "tool_calls": 2, "mcp_calls": 2, "state": 2, "episodes": 3, "cli_spans": 2,
        "cli_events": 2,
    }  # fmt: skip

    with SessionStore(db) as local, SessionStore(postgres_url) as server:
        for session_id in ("s-1", "s-2"):
            mine, theirs = local.get_session(session_id), server.get_session(session_id)
            assert mine is not None and theirs is not None
            assert theirs.to_dict() == mine.to_dict()
        assert server.state_get("health", "weight") == {"kg": 71.2}
        assert server.state_get("health", "shared") == "from the server", "the server's value kept"
        assert server.resolve_session("rt-1") == local.resolve_session("rt-1")
        assert [{k: v for k, v in c.items() if k != "id"} for c in server.mcp_calls("s-1")] == [
            {k: v for k, v in c.items() if k != "id"} for c in local.mcp_calls("s-1")
        ]
        assert [e["prompt"] for e in server.recent_episodes("health", 5)] == [
            "and now?", "how much?", "other host",
        ], "copied in the source's order, after what the server held"  # fmt: skip
        assert server.cli_spans("s-1") == local.cli_spans("s-1")
        assert server.cli_events("s-1") == local.cli_events("s-1")

    again = spawnkit("store", "migrate", "--to", postgres_url, str(db))
    assert again.returncode == 0, again.stderr
    assert _report(again.stdout) == {
        "sessions": (2, 0, 2), "tool_calls": (2, 0, 2), "mcp_calls": (2, 0, 2),
        "state": (2, 0, 2), "episodes": (2, 0, 2), "cli_spans": (2, 0, 2),
        "cli_events": (2, 0, 2),
    }  # fmt: skip
    assert _counts(postgres_url)["episodes"] == 3


def test_the_default_source_is_the_home_store(isolated_home: Path, postgres_url: str) -> None:
    _fill(isolated_home / "sessions.db")
    done = spawnkit("store", "migrate", "--to", postgres_url)
    assert done.returncode == 0, done.stderr
    assert _counts(postgres_url)["sessions"] == 2


def test_bad_targets_are_one_line_without_the_password(tmp_path: Path, postgres_url: str) -> None:
    db = tmp_path / "sessions.db"
    _fill(db)
    wrong = postgres_url.replace(PASSWORD, "not-the-password")
    done = spawnkit("store", "migrate", "--to", wrong, str(db))
    assert_one_line_error(done, redact_url(wrong), "cannot be reached")
    assert "not-the-password" not in done.stderr

    done = spawnkit("store", "migrate", "--to", str(tmp_path / "other.db"), str(db))
    assert_one_line_error(done, "is not a postgresql:// URL")
    done = spawnkit("store", "migrate", "--to", postgres_url, str(tmp_path / "missing.db"))
    assert_one_line_error(done, "no session store at")


def test_batches_resume_where_a_partial_copy_stopped(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row per batch, and half the episodes already copied by an interrupted run."""
    db = tmp_path / "sessions.db"
    _fill(db)
    with SessionStore(db) as local:
        for n in range(5):
            local.add_episode("health", None, f"q{n}", f"a{n}")
        (first,) = local.recent_episodes("health", 7)[-1:]
    monkeypatch.setattr(store_migrate, "BATCH_ROWS", 1)
    with SessionStore(postgres_url) as server, server._db.transaction() as tx:
        tx.execute(
            "INSERT INTO episodes (butler, session_id, prompt, output, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            ("health", first["session_id"], first["prompt"], first["output"], first["created_at"]),
        )
    report = store_migrate.migrate_store(db, postgres_url)
    assert report.verified
    copies = {t.name: (t.source, t.copied, t.present) for t in report.tables}
    assert copies["episodes"] == (7, 6, 7) and copies["sessions"] == (2, 2, 2)
    with SessionStore(db) as local, SessionStore(postgres_url) as server:
        assert server.recent_episodes("health", 10) == local.recent_episodes("health", 10)
