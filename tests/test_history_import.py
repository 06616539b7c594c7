"""History that outlives the CLIs: ``spawnkit history import``, machines, exports.

The imported transcripts are the real ones of ``tests/data/real/``: machine A is a copy of
the Claude Code corpus, machine B a copy of the Codex one plus one Claude session of A.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from spawnkit.history import (
    HistoryError,
    UnpricedModelWarning,
    export,
    import_history,
    transcripts,
)
from spawnkit.store import SessionStore

from .conftest import REPO

REAL = REPO / "tests" / "data" / "real"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", UnpricedModelWarning)


def totals(frame: pd.DataFrame) -> tuple[int, int, float]:
    return len(frame), int(frame["total_tokens"].sum()), round(float(frame["cost_usd"].sum()), 9)


def test_importing_a_twice_and_b_once_gives_exactly_a_plus_b(tmp_path: Path) -> None:
    store = tmp_path / "sessions.db"
    a = tmp_path / "a-claude"
    shutil.copytree(REAL / "claude", a)
    b = tmp_path / "b-claude"
    session = next((a / "projects" / "yoavf-ai-sessions").glob("*.jsonl"))
    (b / "projects" / "other").mkdir(parents=True)
    shutil.copy(session, b / "projects" / "other" / "copied.jsonl")  # A's session, on B too
    alone_a = transcripts("claude", a, cache=False)
    alone_b = transcripts("claude", b, cache=False)

    (first,) = import_history("claude", a, machine="laptop-a", store=store)
    (second,) = import_history("claude", a, machine="laptop-a", store=store)
    import_history("claude-code", b, machine="laptop-b", store=store)
    assert first.lines_added > 0 and second.lines_added == 0
    assert first.usage_rows == second.usage_rows == len(alone_a.usage)

    merged = transcripts("claude", [], imported=True, store=store, cache=False)
    by_machine = merged.sessions.groupby("machine", observed=True)
    assert set(by_machine.groups) == {"laptop-a", "laptop-b"}
    # Machine B's copy of a session of A is the same responses: counted once, for A (the
    # first file), so B shows the session with no responses of its own.
    assert totals(merged.sessions[merged.sessions["machine"] == "laptop-a"]) == totals(
        alone_a.sessions
    )
    assert int(merged.sessions["total_tokens"].sum()) == int(alone_a.sessions["total_tokens"].sum())
    assert len(merged.usage) == len(alone_a.usage) < len(alone_a.usage) + len(alone_b.usage)
    # The rows for SQL keep both machines' responses, each machine's exactly once.
    conn = sqlite3.connect(store)
    counts = dict(conn.execute("SELECT machine, count(*) FROM history_usage GROUP BY machine"))
    conn.close()
    assert counts == {"laptop-a": len(alone_a.usage), "laptop-b": len(alone_b.usage)}


def test_history_is_still_there_after_the_cli_deleted_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_home: Path
) -> None:
    home = tmp_path / "home"
    shutil.copytree(REAL / "codex", home / ".codex")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("CODEX_HOME", raising=False)
    (first,) = import_history("codex")  # default folders, this machine, the default store
    file = next((home / ".codex" / "sessions").rglob("rollout-*.jsonl"))
    # The file grows after the import: the next import adds its new line only.
    with file.open("a") as fh:
        fh.write('{"timestamp":"2026-03-01T00:00:00Z","type":"event_msg","payload":{}}\n')
    (grown,) = import_history("codex")
    assert first.lines_added > 1 and grown.lines_added == 1
    before = transcripts("codex", cache=False)
    # Then the CLI's clean-up removes everything.
    shutil.rmtree(home / ".codex")
    after = transcripts("codex", cache=False)
    pd.testing.assert_frame_equal(
        after.sessions.drop(columns=["machine", "n_files"]).reset_index(drop=True),
        before.sessions.drop(columns=["machine", "n_files"]).reset_index(drop=True),
        check_categorical=False,
    )
    assert all(p.startswith("imported:") for p in after.files["path"])
    # Still on disk: read from disk, not twice.
    shutil.copytree(REAL / "codex", home / ".codex")
    both = transcripts("codex", cache=False)
    assert len(both.files) == len(before.files) and not any(
        p.startswith("imported:") for p in both.files["path"]
    )


def test_bad_imports_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="bad machine name"):
        import_history("codex", REAL / "codex", machine="a/b", store=tmp_path / "s.db")
    with pytest.raises(HistoryError, match="needs one --source"):
        import_history(None, REAL / "codex", store=tmp_path / "s.db")
    with pytest.raises(HistoryError, match="no codex transcripts folder"):
        import_history("codex", tmp_path / "nowhere", store=tmp_path / "s.db")


def test_exports_are_parquet_and_a_folder_duckdb_reads(tmp_path: Path) -> None:
    store = tmp_path / "sessions.db"
    with SessionStore(store):
        pass
    import_history("gemini", REAL / "gemini", machine="desk", store=store)
    loaded = transcripts("gemini", [], imported=True, store=store, cache=False)
    written = loaded.to_parquet(tmp_path / "one")
    back = pd.read_parquet(written / "sessions.parquet")
    assert list(back["session_id"]) == list(loaded.sessions["session_id"])
    assert list(back["machine"].astype(str)) == ["desk"] * len(back)

    folder = export(tmp_path / "all", ["spawnkit", "gemini"], store=store)
    conn = duckdb.connect()
    conn.execute(f"SET file_search_path = '{folder}'")
    conn.execute((folder / "views.sql").read_text())
    rows = conn.sql(
        "SELECT source, count(*), sum(total_tokens) FROM sessions GROUP BY source"
    ).fetchall()
    assert rows == [("gemini", len(loaded.sessions), int(loaded.sessions["total_tokens"].sum()))]
    (usage,) = conn.sql("SELECT count(*) FROM usage WHERE source = 'gemini'").fetchall()
    assert usage == (len(loaded.usage),)


def test_the_command_line_imports_and_reports_machines(tmp_path: Path) -> None:
    env = {"SPAWNKIT_HOME": str(tmp_path / "state"), "HOME": str(tmp_path), "PATH": "/usr/bin"}

    def spawnkit(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "spawnkit", "history", *argv], env=env,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip

    done = spawnkit("import", "--source", "codex", "--root", str(REAL / "codex"),
                    "--machine", "old-laptop")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("codex (old-laptop): 12 files,")
    assert "warning: no price for model 'gpt-5.6-luna'" in done.stderr
    shown = spawnkit("--source", "codex", "--by", "session", "--machine", "old-laptop")
    assert shown.returncode == 0 and "old-laptop" in shown.stdout and "thinking" in shown.stdout
    assert spawnkit("import", "--machine", "x y").returncode == 2
