"""The PostgreSQL server going away mid-run, and coming back: nothing is lost.

A real Claude Code CLI runs a butler on the replay model, its record in a real PostgreSQL
(tests/postgres.py). While the CLI waits in a shell tool, the test stops the server; the
run goes on and ends while the server is down: its completion and its tool calls wait in
the local journal (spawnkit.store.journal). The server starts again and the next command
writes them: exactly one complete record, with its tool calls, and an empty journal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from spawnkit.result import SpawnerResult, ToolCall
from spawnkit.store import SessionStore
from spawnkit.store.backend import redact_url

from .conftest import REPO, RosterFactory
from .postgres import PASSWORD, PostgresServer
from .test_cli import assert_one_line_error, spawnkit

START_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 180.0

SCENARIO = """
[[turn]]
text = "Waiting for the signal."
shell = "touch tool-started; while [ ! -e go ]; do sleep 0.1; done; echo released"
usage = { input_tokens = 100, output_tokens = 20 }
[[turn]]
shell = "echo second call"
[[turn]]
text = "Done: {{ last_tool_result }}"
usage = { input_tokens = 120, output_tokens = 10 }
"""


@pytest.fixture
def server_back(postgres: PostgresServer) -> Iterator[PostgresServer]:
    """The shared server, running again after the test whatever happened in it."""
    yield postgres
    try:
        with psycopg.connect(postgres.url(), connect_timeout=2):
            return
    except psycopg.OperationalError:
        postgres.start()


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.e2e
def test_a_run_outlives_the_server_and_its_record_is_written_when_it_is_back(
    make_butler: RosterFactory,
    tmp_path: Path,
    isolated_home: Path,
    postgres_url: str,
    server_back: PostgresServer,
) -> None:
    make_butler("waiter")
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    SessionStore(postgres_url).close()  # the schema, before the test polls it
    run = subprocess.Popen(
        [sys.executable, "-m", "spawnkit", "--store", postgres_url, "run", "--roster",
         str(tmp_path / "roster"), "--butler", "waiter", "--replay", str(scenario), "--json",
         "wait for the signal"],
        env={**os.environ, "SPAWNKIT_LEASE_S": "3"}, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        # The shell tool works in the run's workspace (what a sandbox lets it see).
        deadline = time.monotonic() + START_TIMEOUT_S
        workspace: Path | None = None
        while workspace is None or not (workspace / "tool-started").exists():
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the CLI reached its shell tool"
            time.sleep(0.1)
            found = _rows(postgres_url, "SELECT workspace FROM spawnkit.sessions")
            workspace = Path(str(found[0][0])) if found and found[0][0] else None
        assert _rows(postgres_url, "SELECT status FROM spawnkit.sessions") == [("running",)]
        server_back.stop()  # mid-run: lease renewals fail from now on
        time.sleep(1.5)  # at least one renewal round finds the server away
        (workspace / "go").touch()
        out, err = run.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=10)
    assert run.returncode == 0, err
    result = json.loads(out)
    assert result["success"] is True and result["output"] == "Done: second call"
    assert [c["tool"] for c in result["tool_calls"]] == ["Bash", "Bash"]
    assert f"the session store {redact_url(postgres_url)} went away" in err
    assert PASSWORD not in err
    journal = isolated_home / "store-journal.db"
    assert journal.exists()

    server_back.start()
    listed = spawnkit("--store", postgres_url, "sessions", "--json")  # opening it replays
    assert listed.returncode == 0, listed.stderr
    (session,) = json.loads(listed.stdout)
    assert (session["id"], session["status"], session["success"]) == (
        result["session_id"], "success", True,
    )  # fmt: skip
    assert session["output"] == "Done: second call"
    assert [c["output"].strip() for c in session["tool_calls"]] == ["released", "second call"]
    assert _rows(
        postgres_url, "SELECT seq, tool, status FROM spawnkit.tool_calls ORDER BY seq"
    ) == [(0, "Bash", "ok"), (1, "Bash", "ok")]
    assert _rows(postgres_url, "SELECT count(*) FROM spawnkit.sessions") == [(1,)]
    replayed = spawnkit("--store", postgres_url, "store", "replay")
    assert replayed.returncode == 0, replayed.stderr
    assert "0 write(s) waiting" in replayed.stdout and "0 failed" in replayed.stdout


def _result(session_id: str) -> SpawnerResult:
    now = datetime.now(UTC)
    call = ToolCall.start("c1", "Bash", {"command": "ls"}, now).finish("a b", False, now)
    return SpawnerResult(output="done", success=True, session_id=session_id, tool_calls=[call])


def test_writes_while_the_server_is_away_are_replayed_in_the_background(
    postgres_url: str, server_back: PostgresServer
) -> None:
    with SessionStore(postgres_url) as store:
        store.create_session(
            "s-1", butler="b", runtime="claude-code", model=None, prompt="p", context=None,
            trigger_source="api",
        )  # fmt: skip
        server_back.stop()
        store.mark_started("s-1", started_at=datetime.now(UTC), trace_id="t-1")
        # The butler's MCP server and the run's memory write while the server is away too.
        store.record_mcp_call(
            butler="b", session_key="s-1", tool="state_get", arguments={"key": "k"},
            result="{}", is_error=False, called_at=datetime.now(UTC), duration_ms=4,
        )  # fmt: skip
        store.complete_session("s-1", _result("s-1"))
        store.add_episode("b", "s-1", "p", "done")
        assert store.pending_writes() == 4
        server_back.start()
        deadline = time.monotonic() + 60
        while store.pending_writes():
            assert time.monotonic() < deadline, "the background retry wrote the journal"
            time.sleep(0.1)
        record = store.get_session("s-1")
    assert record is not None
    assert (record.status, record.trace_id, record.output) == ("success", "t-1", "done")
    assert record.started_at is not None and [c.output for c in record.tool_calls] == ["a b"]
    assert _rows(postgres_url, "SELECT call_id FROM spawnkit.tool_calls") == [("c1",)]
    assert _rows(postgres_url, "SELECT session_id, tool FROM spawnkit.mcp_calls") == [
        ("s-1", "state_get")
    ]
    assert _rows(postgres_url, "SELECT session_id, output FROM spawnkit.episodes") == [
        ("s-1", "done")
    ]


def test_a_replayed_completion_replaces_a_crash_another_host_inferred(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server was away longer than the lease: once it is back, another host may close
    the run as crashed before this host's journal is written. The real outcome wins."""
    monkeypatch.setenv("SPAWNKIT_HOST", "host-a")
    with SessionStore(postgres_url, lease_s=0.01) as host_a:
        host_a.create_session(
            "s-1", butler="b", runtime="claude-code", model=None, prompt="p", context=None,
            trigger_source="api", created_at=datetime.now(UTC) - timedelta(minutes=1),
        )  # fmt: skip
        time.sleep(0.05)
        monkeypatch.setenv("SPAWNKIT_HOST", "host-b")
        with SessionStore(postgres_url) as host_b:
            assert host_b.get_session("s-1").status == "crashed"  # type: ignore[union-attr]
            host_a.complete_session("s-1", _result("s-1"))
            record = host_b.get_session("s-1")
            assert record is not None and (record.status, record.output) == ("success", "done")
            # Another host's completion does not: only the run's own host knows the outcome.
            host_b.complete_session("s-1", SpawnerResult(output="other", success=False))
            assert host_b.get_session("s-1").output == "done"  # type: ignore[union-attr]


def test_a_server_down_at_trigger_time_is_one_line_naming_the_url(
    make_butler: RosterFactory, tmp_path: Path, postgres: PostgresServer
) -> None:
    make_butler("waiter")
    with psycopg.connect(postgres.url()) as conn:
        port = conn.info.port
    down = postgres.url().replace(f":{port}/", ":1/")  # nothing listens on port 1
    done = spawnkit(
        "run", "--roster", str(tmp_path / "roster"), "--butler", "waiter",
        "--replay", str(REPO / "roster" / "health" / "scenarios" / "demo.toml"), "hello",
        SPAWNKIT_STORE=down,  # a password never on a command line
    )  # fmt: skip
    assert_one_line_error(done, "postgresql://postgres@127.0.0.1:1/postgres", "cannot be reached")
    assert PASSWORD not in done.stderr


def test_replaying_a_write_the_server_already_has_changes_nothing(
    postgres_url: str, server_back: PostgresServer
) -> None:
    """A write's answer can be lost with the connection after the server committed it: the
    journal then replays it. Every journaled write, replayed twice, leaves one copy."""
    spans = [{"session_id": "s-1", "trace_id": "t", "span_id": "a1", "parent_span_id": None,
              "name": "tool", "service": "claude", "start_ns": 1, "end_ns": 2, "status": "ok",
              "attributes": {"k": 1}, "reparented": False}]  # fmt: skip
    events = [{"session_id": "s-1", "kind": "log", "name": "api_request", "service": "claude",
               "time_ns": 5, "trace_id": None, "span_id": None, "value": None,
               "attributes": {}}]  # fmt: skip
    with SessionStore(postgres_url) as store:
        store.create_session(
            "s-1", butler="b", runtime="claude-code", model=None, prompt="p", context=None,
            trigger_source="api",
        )  # fmt: skip
        server_back.stop()
        store.mark_started("s-1", started_at=datetime.now(UTC))
        store.record_cli_spans(spans)
        store.record_cli_events(events)
        store.complete_session("s-1", _result("s-1"))
        store.add_episode("b", "s-1", "p", "done")
        journal = store.journal
        assert journal is not None
        kept = []
        while (entry := journal.first()) is not None:  # what the journal holds, in order
            kept.append(entry)
            journal.done(entry)
        assert [e.op for e in kept] == ["started", "cli_spans", "cli_events", "complete", "episode"]
        server_back.start()
        for _ in range(2):  # written, then written again as if its answer had been lost
            for entry in kept:
                journal.append(entry.op, entry.session_id, entry.payload, "replayed again")
            while store.pending_writes():
                store.replay_journal()
    for table, count in (("sessions", 1), ("tool_calls", 1), ("cli_spans", 1),
                         ("cli_events", 1), ("episodes", 1)):  # fmt: skip
        assert _rows(postgres_url, f"SELECT count(*) FROM spawnkit.{table}") == [(count,)], table
    assert _rows(postgres_url, "SELECT status FROM spawnkit.sessions") == [("success",)]


def test_a_completion_journaled_before_the_refusal_count_is_replayed(postgres_url: str) -> None:
    """A completion kept in the journal by a spawnkit from before ``network_denied`` (one
    parameter fewer) is written all the same when it is replayed, its count 0."""
    done = datetime.now(UTC).isoformat()
    old_session = [
        "success", 1, None, None, "done", "[]", 0, 10, 1, 2, 0, 0, None, 1, None, None, None,
        done, None, None, "s-old", None,
    ]  # fmt: skip
    with SessionStore(postgres_url) as store:
        store.create_session(
            "s-old", butler="b", runtime="codex", model=None, prompt="p", context=None,
            trigger_source="api",
        )  # fmt: skip
        journal = store.journal
        assert journal is not None
        old_session[-1] = store.host
        payload = {"session": old_session, "calls": [], "live": False}
        journal.append("complete", "s-old", payload, "journaled by an older spawnkit")
        while store.pending_writes():
            store.replay_journal()
        record = store.get_session("s-old")
    assert record is not None
    assert (record.status, record.output, record.network_denied) == ("success", "done", 0)


def test_a_completion_journaled_before_permission_answers_is_replayed(postgres_url: str) -> None:
    """A completion journaled by a spawnkit from before ``permissions`` (one parameter
    fewer than now, ``network_denied`` there) is written all the same, with no answers."""
    done = datetime.now(UTC).isoformat()
    old_session = [
        "success", 1, None, None, "done", "[]", 0, 10, 1, 2, 0, 0, None, 1, None, None, None,
        done, None, None, 4, "s-old", None,
    ]  # fmt: skip
    with SessionStore(postgres_url) as store:
        store.create_session(
            "s-old", butler="b", runtime="codex", model=None, prompt="p", context=None,
            trigger_source="api",
        )  # fmt: skip
        journal = store.journal
        assert journal is not None
        old_session[-1] = store.host
        payload = {"session": old_session, "calls": [], "live": False}
        journal.append("complete", "s-old", payload, "journaled by an older spawnkit")
        while store.pending_writes():
            store.replay_journal()
        record = store.get_session("s-old")
    assert record is not None
    assert (record.status, record.network_denied, record.permissions) == ("success", 4, ())
