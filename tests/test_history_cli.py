"""``spawnkit history``: summary tables from the store and from transcripts, --json, --since."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spawnkit.cli import main
from spawnkit.store import SessionStore

from .conftest import REPO
from .test_history_store import record

CLAUDE = REPO / "tests" / "fixtures" / "history" / "claude"


@pytest.fixture
def home_store(isolated_home: Path) -> Iterator[SessionStore]:
    with SessionStore() as store:
        start = datetime(2026, 10, 1, 12, tzinfo=UTC)
        record(store, "s1", butler="health", at=start, cost=1.25)
        record(store, "s2", butler="health", at=start + timedelta(days=2), success=False)
        record(store, "s3", butler="general", at=start + timedelta(days=2, hours=1), cost=0.5)
        yield store


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["history", *argv]) == 0
    return capsys.readouterr().out


def test_by_day_from_the_store(
    home_store: SessionStore, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = json.loads(run(capsys, "--json"))
    assert [(r["date"], r["sessions"]) for r in rows] == [("2026-10-01", 1), ("2026-10-03", 2)]
    assert rows[0]["cost_usd"] == 1.25 and rows[0]["input_tokens"] == 1_000_000
    text = run(capsys)
    assert "2026-10-03" in text and "1,000,000" in text and "1.25" in text


def test_by_butler_and_by_session_with_since(
    home_store: SessionStore, capsys: pytest.CaptureFixture[str]
) -> None:
    groups = json.loads(run(capsys, "--by", "group", "--json"))
    assert [(g["butler"], g["sessions"], g["failed"]) for g in groups] == [
        ("health", 2, 1), ("general", 1, 0)]  # fmt: skip
    recent = json.loads(run(capsys, "--by", "session", "--since", "2026-10-02", "--json"))
    assert [r["session_id"] for r in recent] == ["s3", "s2"]
    assert recent[0]["started_at"].startswith("2026-10-03T13:00:00")
    assert json.loads(run(capsys, "--by", "session", "-n", "1", "--json"))[0]["session_id"] == "s3"


def test_transcripts_by_project_and_session(capsys: pytest.CaptureFixture[str]) -> None:
    days = json.loads(run(capsys, "--source", "claude", "--root", str(CLAUDE), "--json"))
    assert days == [{**days[0], "date": "2026-11-22", "sessions": 2, "input_tokens": 8960}]
    (project,) = json.loads(run(capsys, "--source", "claude", "--root", str(CLAUDE),
                                "--by", "group", "--json"))  # fmt: skip
    assert project["project"] == "-fixture-work" and project["tool_errors"] == 1
    text = run(capsys, "--source", "claude", "--root", str(CLAUDE), "--by", "session")
    assert "claude-opus-5-5" in text and "reported" in text
    assert (
        run(capsys, "--source", "claude", "--root", str(CLAUDE), "--since", "2027-01-01")
        == "(no history)\n"
    )


def test_a_real_process_and_its_errors(tmp_path: Path) -> None:
    def spawnkit(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "spawnkit", "history", *argv],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip

    done = spawnkit("--source", "gemini", "--root", str(CLAUDE.parent / "gemini"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["output_tokens"] == 95
    missing = spawnkit("--source", "codex", "--root", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no codex transcripts folder" in missing.stderr
    bad_prices = tmp_path / "prices.json"
    bad_prices.write_text("{")
    refused = spawnkit("--prices", str(bad_prices))
    assert refused.returncode == 2 and "cannot read the pricing table" in refused.stderr


def test_source_names_claude_code_and_claude_are_one(capsys: pytest.CaptureFixture[str]) -> None:
    canonical = json.loads(run(capsys, "--source", "claude-code", "--root", str(CLAUDE), "--json"))
    assert json.loads(run(capsys, "--source", "claude", "--root", str(CLAUDE), "--json")) == (
        canonical
    )


def test_a_session_is_found_by_prefix_however_old(
    isolated_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SessionStore() as store:
        record(store, "0ld-session", butler="health", at=datetime(2020, 1, 1, tzinfo=UTC))
    # Ten thousand newer sessions, written in bulk.
    conn = sqlite3.connect(isolated_home / "sessions.db")
    with conn:
        conn.executemany(
            "INSERT INTO sessions (id, butler, runtime, prompt, trigger_source, status, "
            "created_at) VALUES (?, 'health', 'codex', 'p', 'external', 'success', ?)",
            [(f"new-{i:05d}", f"2026-01-01T00:00:{i % 60:02d}+00:00") for i in range(10_050)],
        )
    conn.close()
    assert main(["sessions", "0ld", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "0ld-session"
    assert main(["sessions", "new-0"]) == 2
    assert "several sessions match 'new-0'" in capsys.readouterr().err


def test_doctor_warns_when_claude_code_deletes_transcripts_after_the_default_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "claude-config"
    (config / "projects").mkdir(parents=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    main(["doctor"])
    assert "deletes transcripts in" in capsys.readouterr().err
    (config / "settings.json").write_text(json.dumps({"cleanupPeriodDays": 36500}))
    main(["doctor"])
    assert "deletes transcripts" not in capsys.readouterr().err
