"""Token totals equal ccusage's, per session and per day, on a synthetic corpus with every trap.

ccusage (pinned, native binary) is installed with npm into ``benchmarks/.node`` the first time;
the test skips, saying why, only when npm cannot install it. Per day, every token count must
be equal and costs equal to 1e-9. Per session likewise, except where ccusage's ``session``
report counts a side-chain replay that its own ``daily`` report drops: for each such session
the test runs ccusage's daily report on that session's files alone and requires spawnkit's
totals to equal it exactly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spawnkit.history import transcripts

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import gen_transcripts
import history as bench

TOKENS = bench.TOKENS


@pytest.fixture(scope="module")
def ccusage() -> Path:
    try:
        return bench.ccusage_binary()
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        pytest.skip(f"ccusage {bench.CCUSAGE_VERSION} could not be installed with npm: {exc}")


def equal_tokens(theirs: dict[str, Any], ours: Any) -> bool:
    return all(theirs[a] == int(ours[b]) for a, b in TOKENS)


def test_tokens_equal_ccusage_per_session_and_per_day(ccusage: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    gen_transcripts.generate(corpus, 12, seed=11)
    sessions = bench.run_ccusage(ccusage, corpus, "session")
    daily = bench.run_ccusage(ccusage, corpus, "daily")
    loaded = transcripts("claude", corpus, cache=False)

    # The corpus holds the traps this comparison is about.
    usage = loaded.usage
    assert loaded.stats.bad_lines > 0 and usage["is_sidechain"].any()
    assert (usage["cache_read_tokens"] > 200_000).any() and (usage["cache_write_1h"] > 0).any()
    assert usage["model"].nunique() >= 5

    days = loaded.daily().set_index("date")
    assert sorted(days.index) == [row["period"] for row in daily["daily"]]
    for row in daily["daily"]:
        mine = days.loc[row["period"]]
        assert equal_tokens(row, mine), row["period"]
        assert float(mine["cost_usd"]) == pytest.approx(row["totalCost"], rel=1e-9)

    ours = loaded.sessions.set_index("session_id")
    assert sorted(ours.index) == sorted(row["period"] for row in sessions["session"])
    replays = []
    for row in sessions["session"]:
        mine = ours.loc[row["period"]]
        assert sorted(row["modelsUsed"]) == mine["models"]
        if equal_tokens(row, mine):
            assert float(mine["cost_usd"]) == pytest.approx(row["totalCost"], rel=1e-9)
        else:
            replays.append(row["period"])
    assert len(replays) < len(ours) / 4
    for sid in replays:
        alone = tmp_path / "alone" / sid
        for path in loaded.files.loc[loaded.files["session_id"] == sid, "path"]:
            target = alone / Path(path).relative_to(corpus)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
        totals = bench.run_ccusage(ccusage, alone, "daily")["totals"]
        assert equal_tokens(totals, ours.loc[sid]), sid
        assert float(ours.loc[sid, "cost_usd"]) == pytest.approx(totals["totalCost"], rel=1e-9)


@pytest.mark.parametrize(("source", "variable"), [("codex", "CODEX_HOME"),
                                                  ("gemini", "GEMINI_DATA_DIR")])  # fmt: skip
def test_real_codex_and_gemini_transcripts_equal_ccusage(
    ccusage: Path, source: str, variable: str
) -> None:
    root = REPO / "tests" / "fixtures" / "history" / source
    done = subprocess.run(
        [str(ccusage), source, "session", "--json", "--offline"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(root / "no-home"), variable: str(root)},
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    (theirs,) = json.loads(done.stdout)["sessions"]
    (ours,) = transcripts(source, root, cache=False).sessions.to_dict(orient="records")  # type: ignore[arg-type]
    assert theirs["inputTokens"] == ours["input_tokens"] == 4000
    assert theirs["outputTokens"] == ours["output_tokens"]
    assert theirs["cacheReadTokens"] == ours["cache_read_tokens"]
    assert theirs["cacheCreationTokens"] == ours["cache_write_tokens"]
    if source == "gemini":  # Codex's replay model has no price on either side
        assert ours["cost_usd"] == pytest.approx(theirs["totalCost"], rel=1e-12)
