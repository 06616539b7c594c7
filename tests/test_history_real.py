"""Real transcripts from public repositories, against ccusage 20.0.24 run here on the same files.

``tests/data/real/`` holds transcripts written by real Claude Code (1.0.x to 2.1.x), Codex
(0.39 to 0.146) and Gemini CLI (both file formats) sessions, collected from the test fixtures
of the CLIs' users and of tools that parse these files (``MANIFEST.json`` names each file's
repository, path, commit and license). For every source, per session and per day, token
totals equal ccusage's and costs equal ccusage's, except where a rule of docs/history.md
says why not; there the test computes the difference the rule predicts:

* spawnkit keeps thinking tokens apart from output (``output_tokens`` + ``thinking_tokens``
  is ccusage's output for Claude and Codex; Gemini's output already excludes them there);
* spawnkit lists a session that has no counted response (ccusage leaves it out);
* a sub-agent's responses that Claude Code 2.1 streamed into the parent's transcript
  (``agent_progress`` lines) count in ccusage's ``daily`` report and in spawnkit, but not in
  ccusage's ``session`` report: per session, ccusage equals spawnkit run on copies of the
  files without those lines;
* spawnkit reads any valid JSON line; ccusage's fast path skips lines not written compactly
  (``{"type": "assistant"`` with spaces), which the CLIs never write but a hand-written
  fixture does: ccusage's totals are spawnkit's without those files' sessions, and ccusage
  run on compacted copies of them gives spawnkit's numbers for them;
* a model spawnkit's table cannot price (``gpt-5.6-luna``) has no cost: with ccusage's price
  for it added to the table, costs are equal again.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spawnkit.history import (
    PricingTable,
    Transcripts,
    UnpricedModelWarning,
    default_pricing,
    transcripts,
)
from spawnkit.history.frames import _WARNED
from spawnkit.history.transcript_frames import daily_totals

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import history as bench

REAL = REPO / "tests" / "data" / "real"
# ccusage's price of the one model of the corpus that spawnkit's table has no price for.
LUNA = {"gpt-5.6-luna": {"input": 0.2, "output": 1.2, "cache_read": 0.02}}


@pytest.fixture(scope="module")
def ccusage() -> Path:
    try:
        return bench.ccusage_binary()
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        pytest.skip(f"ccusage {bench.CCUSAGE_VERSION} could not be installed with npm: {exc}")


def run(binary: Path, *argv: str, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(binary), *argv, "--json", "--offline", "--timezone", "UTC"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(REAL / "no-home"), "TZ": "UTC", **env},
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def load(source: str, pricing: PricingTable | None = None) -> Transcripts:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnpricedModelWarning)
        return transcripts(source, REAL / source.split("-")[0], cache=False, pricing=pricing)


def tokens(row: Any, *, thinking_in_output: bool) -> tuple[int, int, int, int]:
    output = int(row["output_tokens"]) + (int(row["thinking_tokens"]) if thinking_in_output else 0)
    return (int(row["input_tokens"]), output, int(row["cache_write_tokens"]),
            int(row["cache_read_tokens"]))  # fmt: skip


def theirs(row: dict[str, Any]) -> tuple[int, int, int, int]:
    return (row["inputTokens"], row["outputTokens"], row.get("cacheCreationTokens", 0),
            row["cacheReadTokens"])  # fmt: skip


def cost_of(row: dict[str, Any]) -> float:
    return float(row.get("totalCost", row.get("costUSD", 0.0)))


# -- the corpus ------------------------------------------------------------------------------


def test_the_corpus_is_what_its_manifest_says() -> None:
    manifest = json.loads((REAL / "MANIFEST.json").read_text())
    listed = {entry["path"] for entry in manifest}
    on_disk = {p.relative_to(REAL).as_posix() for p in REAL.rglob("*") if p.is_file()}
    assert on_disk - {"MANIFEST.json"} == listed
    for entry in manifest:
        data = (REAL / entry["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["path"]
        assert entry["license"] and re.fullmatch(r"[0-9a-f]{40}", entry["commit"])
    assert len({entry["repository"] for entry in manifest}) >= 8
    # Several CLI versions per family, and both Gemini formats.
    claude = load("claude-code").files["version"].dropna().map(lambda v: v.rsplit(".", 1)[0])
    codex = load("codex").files["version"].dropna()
    assert {"1.0", "2.0", "2.1"} <= set(claude)
    assert len(set(codex)) >= 4
    gemini = Counter(Path(p).suffix for p in load("gemini").files["path"])
    assert gemini[".json"] >= 2 and gemini[".jsonl"] >= 2


# -- Claude Code -------------------------------------------------------------------------------


def _spaced(path: Path) -> bool:
    """Whether a file's lines are JSON with spaces after the colons (not as the CLIs write)."""
    return any(re.match(r'\{"[^"]+": ', line) for line in path.read_text().splitlines())


def test_claude_code_equals_ccusage_per_session_and_per_day(ccusage: Path, tmp_path: Path) -> None:
    env = {"CLAUDE_CONFIG_DIR": str(REAL / "claude")}
    by_session = run(ccusage, "session", **env)["session"]
    by_day = run(ccusage, "daily", **env)["daily"]
    loaded = load("claude-code")
    ours = loaded.sessions.set_index("session_id")
    # ccusage's session report does not read sub-agent responses streamed into progress lines.
    streamed = tmp_path / "without-progress"
    for path in (REAL / "claude").rglob("*.jsonl"):
        copy = streamed / path.relative_to(REAL / "claude")
        copy.parent.mkdir(parents=True, exist_ok=True)
        lines = path.read_text().splitlines()
        copy.write_text("".join(f"{x}\n" for x in lines if '"agent_progress"' not in x))
    without = transcripts("claude-code", streamed, cache=False).sessions.set_index("session_id")
    assert (ours["total_tokens"] - without["total_tokens"]).sum() > 0  # the corpus has some
    for row in by_session:
        mine = without.loc[row["period"]]
        assert tokens(mine, thinking_in_output=True) == theirs(row), row["period"]
        assert float(mine["cost_usd"]) == pytest.approx(cost_of(row), rel=1e-9), row["period"]
    # Listed by spawnkit only: sessions without a counted response, and the sessions of
    # files ccusage's fast path does not read (spaced JSON).
    spaced = [Path(p) for p in loaded.files["path"] if _spaced(Path(p))]
    unread = set(loaded.files.loc[loaded.files["path"].isin(map(str, spaced)), "session_id"])
    extra = ours.drop(index=[row["period"] for row in by_session])
    assert unread and unread <= set(extra.index)
    assert (extra.drop(index=list(unread))["total_tokens"] == 0).all()
    # ccusage run on compacted copies of those files gives spawnkit's numbers for them.
    for path in spaced:
        copy = tmp_path / "compacted" / path.relative_to(REAL / "claude")
        copy.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(json.loads(line), separators=(",", ":"))
                 for line in path.read_text().splitlines() if line.strip()]  # fmt: skip
        copy.write_text("\n".join(lines) + "\n")
    compacted = run(ccusage, "session", CLAUDE_CONFIG_DIR=str(tmp_path / "compacted"))["session"]
    assert {row["period"]: theirs(row) for row in compacted} == {
        sid: tokens(ours.loc[sid], thinking_in_output=True) for sid in unread
    }
    # Per day: ccusage's totals are spawnkit's without those sessions.
    usage = loaded.usage[~loaded.usage["session_id"].astype(str).isin(unread)]
    days = daily_totals(usage).set_index("date")
    assert sorted(days.index) == sorted(row["period"] for row in by_day)
    for row in by_day:
        mine = days.loc[row["period"]]
        assert tokens(mine, thinking_in_output=True) == theirs(row), row["period"]
        assert float(mine["cost_usd"]) == pytest.approx(cost_of(row), rel=1e-9), row["period"]
    # The corpus exercises the family price (claude-opus-5) and sub-agents.
    assert loaded.usage["cost_estimated"].any() and loaded.usage["is_sidechain"].any()


# -- Codex -------------------------------------------------------------------------------------


def _codex_session_ids(loaded: Transcripts) -> dict[str, str]:
    """ccusage's Codex session id (the path under sessions/) to spawnkit's (the thread id)."""
    root = REAL / "codex" / "sessions"
    return {
        Path(path).relative_to(root).with_suffix("").as_posix(): sid
        for path, sid in zip(loaded.files["path"], loaded.files["session_id"], strict=True)
    }


def test_codex_equals_ccusage_per_session_and_per_day(ccusage: Path) -> None:
    env = {"CODEX_HOME": str(REAL / "codex")}
    by_session = run(ccusage, "codex", "session", **env)["sessions"]
    by_day = run(ccusage, "codex", "daily", **env)["daily"]
    _WARNED.discard("gpt-5.6-luna")  # warned once per process: maybe already
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnpricedModelWarning)
        plain = transcripts("codex", REAL / "codex", cache=False)
    # Without a price for gpt-5.6-luna, its session has no cost, and that is said once.
    luna = plain.sessions[plain.sessions["models"].map(lambda m: "gpt-5.6-luna" in m)]
    assert list(luna["cost_source"]) == ["unpriced"] and luna["cost_usd"].isna().all()
    assert any("gpt-5.6-luna" in str(w.message) for w in caught)
    loaded = load("codex", default_pricing().with_prices(LUNA))
    ours = loaded.sessions.set_index("session_id")
    ids = _codex_session_ids(loaded)
    for row in by_session:
        mine = ours.loc[ids[row["sessionId"]]]
        assert tokens(mine, thinking_in_output=True) == theirs(row), row["sessionId"]
        assert int(mine["thinking_tokens"]) == row["reasoningOutputTokens"]
        assert float(mine["cost_usd"]) == pytest.approx(cost_of(row), rel=1e-9), row["sessionId"]
    # A file not named rollout-* (ccusage's own fixture) is read.
    assert ours.loc["project-alpha/session-alpha", "input_tokens"] == 2750
    extra = ours.drop(index=[ids[row["sessionId"]] for row in by_session])
    assert len(extra) >= 1 and (extra["total_tokens"] == 0).all()
    days = loaded.daily().set_index("date")
    for row in by_day:
        mine = days.loc[row["date"]]
        assert tokens(mine, thinking_in_output=True) == theirs(row), row["date"]
        assert float(mine["cost_usd"]) == pytest.approx(cost_of(row), rel=1e-9), row["date"]
    # The corpus's bad lines (a trimmed fixture) are located.
    bad = loaded.files[loaded.files["bad_lines"] > 0]
    assert (bad["bad_line_numbers"].map(len) == bad["bad_lines"]).all() and len(bad) >= 1


def test_a_codex_fork_is_counted_as_ccusage_counts_it(ccusage: Path, tmp_path: Path) -> None:
    from .test_history_rules import jsonl, meta, token_count

    T = "2026-10-01T10:00:{:02d}.000Z".format
    folder = tmp_path / "sessions" / "2026" / "10" / "01"
    parent, child = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
    context = {"timestamp": T(0), "type": "turn_context", "payload": {"model": "gpt-5"}}
    jsonl(folder / f"rollout-2026-10-01T10-00-00-{parent}.jsonl", [
        meta(T(0), parent), context, token_count(T(1), (1000, 100, 200, 50)),
        token_count(T(2), (1500, 150, 300, 80)),
    ])  # fmt: skip
    jsonl(folder / f"rollout-2026-10-01T10-00-30-{child}.jsonl", [
        meta(T(30), child, forked_from_id=parent), meta(T(30), parent),
        dict(context, timestamp=T(30)),
        token_count(T(30), (1000, 100, 200, 50)), token_count(T(30), (1500, 150, 300, 80)),
        token_count(T(45), (1600, 150, 310, 80)),
    ])  # fmt: skip
    env = {"CODEX_HOME": str(tmp_path)}
    loaded = transcripts("codex", tmp_path, cache=False)
    ours = loaded.sessions.set_index("session_id")
    by_session = run(ccusage, "codex", "session", **env)["sessions"]
    assert {row["sessionId"].rsplit("-", 5)[-5:][0][:8]: theirs(row) for row in by_session} == {
        sid[:8]: tokens(ours.loc[sid], thinking_in_output=True) for sid in (parent, child)
    }
    (day,) = run(ccusage, "codex", "daily", **env)["daily"]
    assert theirs(day) == tokens(loaded.daily().iloc[0], thinking_in_output=True)


# -- Gemini -------------------------------------------------------------------------------------


def test_gemini_equals_ccusage_per_session_and_per_day(ccusage: Path) -> None:
    env = {"GEMINI_DATA_DIR": str(REAL / "gemini" / "tmp")}
    by_session = run(ccusage, "gemini", "session", **env)["sessions"]
    by_day = run(ccusage, "gemini", "daily", **env)["daily"]
    loaded = load("gemini")
    ours = loaded.sessions.set_index("session_id")
    assert sorted(ours.index) == sorted(row["sessionId"] for row in by_session)
    for row in by_session:
        mine = ours.loc[row["sessionId"]]
        # Gemini's thoughts are outside ccusage's output too, and inside both totals.
        assert tokens(mine, thinking_in_output=False) == theirs(row), row["sessionId"]
        assert int(mine["total_tokens"]) == row["totalTokens"]
        assert float(mine["cost_usd"]) == pytest.approx(cost_of(row), rel=1e-9), row["sessionId"]
    days = loaded.daily().set_index("date")
    for row in by_day:
        mine = days.loc[row["date"]]
        assert tokens(mine, thinking_in_output=False) == theirs(row), row["date"]
        assert float(mine["cost_usd"]) == pytest.approx(cost_of(row), rel=1e-9), row["date"]
    # A chat file outside chats/session-* is read (ccusage reads it too).
    assert any("/checkpoints/" in p for p in loaded.files["path"])
    assert bool(pd.Series(loaded.usage["thinking_tokens"]).sum() > 0)
