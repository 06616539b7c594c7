"""Session history into DataFrames: spawnkit against ccusage, and the store at scale, in one run.

Three figures, each against a baseline measured in the same run:

* cold: all Claude Code transcripts of a synthetic corpus (``gen_transcripts.py``, about
  1 GB by default) into the sessions and tool-calls frames, with an empty cache, against
  ``ccusage session --json --offline`` (its native binary) on the same folder. Rounds
  alternate between the two so drift on a shared machine hits both alike; the ratios are of
  the medians. The headline is the CPU ratio: each side's CPU seconds counted through a
  cgroup of this process (:class:`CpuCounter`), so spawnkit's parse server and its workers
  count as well as ccusage's process; wall time on a shared 2-core machine is mostly noise.
* warm: the same load again with the cache in place (target: under 1 s), against the cold
  median.
* store: 1,000,000 sessions with 10,000,000 tool calls from spawnkit's store into the
  unfiltered ``sessions()`` and ``tool_calls()`` frames (target: each under 2 s), timed
  warm (through the columnar cache, the normal case), on the first read (which builds the
  cache), and filtered (one butler's last week), against ``pandas.read_sql`` over
  ``sqlite3`` on the same file (one round: it takes minutes).

The run also checks correctness: per-session and per-day token totals against ccusage's
``session`` and ``daily`` reports. Generated data lives in ``benchmarks/.work/`` and ccusage
in ``benchmarks/.node/`` (both ignored by git); results go to
``benchmarks/results/history.json``. Usage::

    .venv/bin/python benchmarks/history.py [--size-mb 1000] [--rounds 5] [--store-sessions 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gen_transcripts  # noqa: E402
from cgroup_cpu import CpuCounter  # noqa: E402

from spawnkit import history  # noqa: E402
from spawnkit.history.workers import SERVER as parse_server  # noqa: E402
from spawnkit.store import SessionStore  # noqa: E402

WORK = ROOT / "benchmarks" / ".work"
NODE_PREFIX = ROOT / "benchmarks" / ".node"
CCUSAGE_VERSION = "20.0.24"  # the newest version whose native binary the registry serves
RESULTS = ROOT / "benchmarks" / "results" / "history.json"
TOKENS = [("inputTokens", "input_tokens"), ("outputTokens", "output_tokens"),
          ("cacheCreationTokens", "cache_write_tokens"), ("cacheReadTokens", "cache_read_tokens"),
          ("totalTokens", "total_tokens")]  # fmt: skip


# -- ccusage -------------------------------------------------------------------------------


def ccusage_binary(prefix: Path = NODE_PREFIX) -> Path:
    """The native ccusage binary, installed with npm under ``prefix`` if missing."""
    arch = {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "x64")
    binary = prefix / "node_modules" / "@ccusage" / f"ccusage-linux-{arch}" / "bin" / "ccusage"
    if not binary.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
             f"ccusage@{CCUSAGE_VERSION}"],
            check=True, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    if not binary.exists():
        raise RuntimeError(f"npm installed ccusage but not its native binary at {binary}")
    # npm leaves it without the execute bit; ccusage's own launcher sets it on first run.
    binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def run_ccusage(binary: Path, corpus: Path, report: str) -> dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(corpus / "no-home"),
           "CLAUDE_CONFIG_DIR": str(corpus), "TZ": "UTC", "NO_COLOR": "1"}  # fmt: skip
    done = subprocess.run(
        [str(binary), report, "--json", "--offline", "--timezone", "UTC"],
        env=env, capture_output=True, check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# -- correctness against ccusage -------------------------------------------------------------


def compare(
    loaded: history.Transcripts, sessions: dict[str, Any], daily: dict[str, Any]
) -> dict[str, Any]:
    """Token and cost differences between spawnkit's frames and ccusage's reports."""
    ours = loaded.sessions.set_index("session_id")
    session_diffs = []
    for row in sessions["session"]:
        sid = row["period"]
        if sid not in ours.index:
            session_diffs.append({"session": sid, "missing": True})
            continue
        mine = ours.loc[sid]
        diff = {a: int(mine[b]) - row[a] for a, b in TOKENS if int(mine[b]) != row[a]}
        if diff:
            session_diffs.append({"session": sid, **diff})
    days = loaded.daily().set_index("date")
    day_diffs = []
    cost_diff = 0.0
    for row in daily["daily"]:
        mine = days.loc[row["period"]]
        diff = {a: int(mine[b]) - row[a] for a, b in TOKENS if int(mine[b]) != row[a]}
        cost_diff = max(cost_diff, abs(float(mine["cost_usd"]) - row["totalCost"]))
        if diff:
            day_diffs.append({"date": row["period"], **diff})
    # ccusage's session report counts some side-chain replays its daily report drops; the
    # session differences are fully explained when they add up to that gap.
    gap = sessions["totals"]["totalTokens"] - daily["totals"]["totalTokens"]
    explained = sum(d.get("totalTokens", 0) for d in session_diffs) == -gap
    return {
        "sessions": len(sessions["session"]),
        "ccusage_session_minus_daily_tokens": gap,
        "session_differences_equal_that_gap": explained,
        "spawnkit_sessions": len(ours),
        "session_mismatches": session_diffs,
        "days": len(daily["daily"]),
        "day_mismatches": day_diffs,
        "max_day_cost_difference_usd": cost_diff,
    }


# -- the store at scale ----------------------------------------------------------------------


def make_store(path: Path, n_sessions: int, calls_per_session: int) -> None:
    """A store with the real schema, filled in bulk by SQLite itself (the store's API commits
    row by row, and building ten million rows in Python takes longer than reading them)."""
    SessionStore(path).close()
    t0 = int(datetime(2026, 9, 1, tzinfo=UTC).timestamp())
    stamp = "strftime('%Y-%m-%dT%H:%M:%S+00:00', {}, 'unixepoch')"
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("BEGIN")
        conn.execute(
            f"""WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ? - 1)
            INSERT INTO sessions (id, butler, runtime, model, prompt, trigger_source, status,
                success, error, error_kind, output, num_tool_calls, duration_ms, input_tokens,
                output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, num_turns,
                trace_id, runtime_session_id, created_at, started_at, completed_at, owner_host,
                owner_pid, owner_start)
            SELECT printf('%08x-0000-4000-8000-%012x', i, i),
                CASE i % 5 WHEN 0 THEN 'health' WHEN 1 THEN 'general' WHEN 2 THEN 'relationship'
                    WHEN 3 THEN 'finance' ELSE 'travel' END,
                CASE i % 3 WHEN 0 THEN 'claude-code' WHEN 1 THEN 'codex' ELSE 'gemini' END,
                'claude-sonnet-4-5', 'prompt ' || i, 'external',
                CASE WHEN i % 11 = 0 THEN 'failed' ELSE 'success' END,
                i % 11 != 0, CASE WHEN i % 11 = 0 THEN 'boom' END,
                CASE WHEN i % 11 = 0 THEN 'crash' END, 'output', ?, 500 + (i * 7919) % 120000,
                1000 + i % 9000, 10 + i % 900, i % 50000, i % 5000,
                CASE WHEN i % 5 = 0 THEN NULL ELSE (i % 100) / 1000.0 END, 1 + i % 20,
                printf('%032x', i), printf('%08x-1111-4000-8000-%012x', i, i),
                {stamp.format("? + i * 30")}, {stamp.format("? + i * 30 + 1")},
                {stamp.format("? + i * 30 + 10")}, 'host', 1, '1'
            FROM n""",
            (n_sessions, calls_per_session, t0, t0, t0),
        )  # fmt: skip
        conn.execute(
            f"""WITH RECURSIVE k(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM k WHERE j < ? - 1)
            INSERT INTO tool_calls (session_id, seq, call_id, name, server, tool, input, output,
                status, started_at, finished_at, duration_ms)
            SELECT s.id, k.j, 'toolu_' || s.rowid || '_' || k.j,
                CASE WHEN k.j % 3 = 0 THEN 'Bash' ELSE 'mcp__health__state_get' END,
                CASE WHEN k.j % 3 = 0 THEN NULL ELSE 'health' END,
                CASE WHEN k.j % 3 = 0 THEN 'Bash' ELSE 'state_get' END,
                '{{"key": "weight", "n": ' || k.j || '}}', 'result',
                CASE WHEN (s.rowid + k.j) % 23 = 0 THEN 'error' ELSE 'ok' END,
                {stamp.format("? + (s.rowid - 1) * 30 + k.j")},
                {stamp.format("? + (s.rowid - 1) * 30 + k.j + 1")}, 35
            FROM sessions AS s, k ORDER BY s.rowid, k.j""",
            (calls_per_session, t0, t0),
        )  # fmt: skip
        conn.execute("COMMIT")
    finally:
        conn.close()


def read_sql_baseline(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The obvious way: pandas.read_sql over sqlite3, then the same dtypes by hand."""
    conn = sqlite3.connect(path)
    try:
        s = pd.read_sql("SELECT * FROM sessions", conn)
        c = pd.read_sql("SELECT * FROM tool_calls", conn)
    finally:
        conn.close()
    for frame, columns in ((s, ["created_at", "started_at", "completed_at"]),
                           (c, ["started_at", "finished_at"])):  # fmt: skip
        for column in columns:
            frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
    return s, c


# -- timing ------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed_cpu(fn: Callable[[], Any], counter: CpuCounter) -> tuple[float, float | None]:
    """Wall seconds and CPU seconds (all processes, None without a cgroup) of ``fn()``."""
    before, start = counter.seconds(), time.perf_counter()
    fn()
    wall, after = time.perf_counter() - start, counter.seconds()
    return wall, (None if before is None or after is None else after - before)


def cpu_figures(cold: list[float | None], ccusage: list[float | None]) -> dict[str, Any]:
    """Median CPU seconds of each side, their ratio and the spread of the paired ratios."""
    if any(c is None for c in (*cold, *ccusage)):
        return {"cold_cpu_median_s": None, "ccusage_cpu_median_s": None,
                "cold_vs_ccusage_cpu_ratio": None}  # fmt: skip
    ours, theirs = [float(c or 0) for c in cold], [float(c or 0) for c in ccusage]
    paired = sorted(o / t for o, t in zip(ours, theirs, strict=True))
    med = statistics.median
    return {
        "cold_cpu_median_s": round(med(ours), 3),
        "ccusage_cpu_median_s": round(med(theirs), 3),
        "cold_vs_ccusage_cpu_ratio": round(med(ours) / med(theirs), 3),
        "cold_vs_ccusage_cpu_paired_range": [round(paired[0], 3), round(paired[-1], 3)],
    }


def measure_store(path: Path, rounds: int) -> dict[str, Any]:
    """Warm, first-read and filtered times of the store's frames, and the read_sql baseline."""
    os.environ["SPAWNKIT_HOME"] = tempfile.mkdtemp(prefix="spawnkit-history-bench-store-")
    cache = Path(os.environ["SPAWNKIT_HOME"]) / "history-cache"
    try:
        first_s = []
        for _ in range(max(1, rounds // 2)):
            shutil.rmtree(cache, ignore_errors=True)
            first_s.append(timed(lambda: (history.sessions(path), history.tool_calls(path))))
        sessions_s, calls_s, filtered_s = [], [], []
        last = history.sessions(path, columns=["created_at"])["created_at"].max()
        week = {"butler": "health", "since": last - pd.Timedelta(days=7)}  # its last week
        for _ in range(rounds):
            sessions_s.append(timed(lambda: history.sessions(path)))
            calls_s.append(timed(lambda: history.tool_calls(path)))
            filtered_s.append(timed(lambda: (history.sessions(path, **week),
                                             history.tool_calls(path, **week))))  # fmt: skip
        frames = (history.sessions(path), history.tool_calls(path))
        filtered = history.tool_calls(path, **week)
        baseline_s = timed(lambda: read_sql_baseline(path))
    finally:
        shutil.rmtree(os.environ["SPAWNKIT_HOME"], ignore_errors=True)
    med = statistics.median
    return {
        "store_sessions": int(frames[0].shape[0]),
        "store_tool_calls": int(frames[1].shape[0]),
        "store_mb": round(path.stat().st_size / 1e6, 1),
        "store_sessions_median_s": round(med(sessions_s), 3),
        "store_tool_calls_median_s": round(med(calls_s), 3),
        "store_median_s": round(med(sessions_s) + med(calls_s), 3),
        "store_first_read_median_s": round(med(first_s), 3),
        "store_filtered_median_s": round(med(filtered_s), 3),
        "store_filtered_tool_calls": int(filtered.shape[0]),
        "store_read_sql_baseline_s": round(baseline_s, 3),
        "store_vs_read_sql_ratio": round((med(sessions_s) + med(calls_s)) / baseline_s, 3),
        "store_samples": {
            "sessions": sessions_s,
            "tool_calls": calls_s,
            "first": first_s,
            "filtered": filtered_s,
        },
    }


def corpus_of(work: Path, size_mb: float) -> Path:
    """The generated corpus of ``size_mb`` in ``work``: made the first time (seed 7)."""
    corpus = work / f"claude-{size_mb:g}mb"
    if not (corpus / "projects").is_dir():
        print(f"generating {size_mb:g} MB of transcripts in {corpus} ...", flush=True)
        shutil.rmtree(corpus, ignore_errors=True)
        gen_transcripts.generate(corpus, size_mb, seed=7)
    return corpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store-sessions", type=int, default=1_000_000)
    parser.add_argument("--calls-per-session", type=int, default=10)
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    corpus = corpus_of(args.work, args.size_mb)
    corpus_bytes = sum(p.stat().st_size for p in (corpus / "projects").rglob("*.jsonl"))
    binary = ccusage_binary()
    homes = Path(tempfile.mkdtemp(prefix="spawnkit-history-bench-"))
    counter = CpuCounter()
    try:
        # Warm the page cache (both tools read the same files) and check correctness.
        theirs_sessions = run_ccusage(binary, corpus, "session")
        theirs_daily = run_ccusage(binary, corpus, "daily")

        def cold() -> history.Transcripts:
            os.environ["SPAWNKIT_HOME"] = str(Path(tempfile.mkdtemp(dir=homes)))
            return history.transcripts("claude", root=corpus)

        loaded = cold()
        check = compare(loaded, theirs_sessions, theirs_daily)
        cold_s, ccusage_s, cold_cpu, ccusage_cpu = [], [], [], []
        for _ in range(args.rounds):
            wall, cpu = timed_cpu(lambda: run_ccusage(binary, corpus, "session"), counter)
            ccusage_s.append(wall)
            ccusage_cpu.append(cpu)
            wall, cpu = timed_cpu(cold, counter)
            cold_s.append(wall)
            cold_cpu.append(cpu)
        warm_s = [timed(lambda: history.transcripts("claude", root=corpus))
                  for _ in range(args.rounds)]  # fmt: skip

        store_path = args.work / f"store-{args.store_sessions}x{args.calls_per_session}.db"
        if not store_path.exists():
            print(f"building a store of {args.store_sessions} sessions ...", flush=True)
            make_store(store_path, args.store_sessions, args.calls_per_session)
        store = measure_store(store_path, args.rounds)
    finally:
        # The parse server (and so its workers) lives in the cgroup until stopped; a cgroup
        # with a process left in it cannot be removed.
        parse_server.stop()
        counter.close()
        shutil.rmtree(homes, ignore_errors=True)

    med = statistics.median
    report = {
        "corpus_mb": round(corpus_bytes / 1e6, 1),
        "corpus_files": int(loaded.files.shape[0]),
        "sessions": int(loaded.sessions.shape[0]),
        "tool_calls": int(loaded.tool_calls.shape[0]),
        "rounds": args.rounds,
        "ccusage_version": CCUSAGE_VERSION,
        "ccusage_session_median_s": round(med(ccusage_s), 3),
        "cold_median_s": round(med(cold_s), 3),
        "cold_vs_ccusage_ratio": round(med(cold_s) / med(ccusage_s), 3),
        "cold_vs_ccusage_paired_median_ratio": round(
            med(c / u for c, u in zip(cold_s, ccusage_s, strict=True)), 3
        ),
        **cpu_figures(cold_cpu, ccusage_cpu),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "warm_median_s": round(med(warm_s), 3),
        "warm_vs_cold_ratio": round(med(warm_s) / med(cold_s), 3),
        **{k: v for k, v in store.items() if k != "store_samples"},
        "samples": {
            "ccusage": ccusage_s,
            "cold": cold_s,
            "ccusage_cpu": ccusage_cpu,
            "cold_cpu": cold_cpu,
            "warm": warm_s,
            **{f"store_{k}": v for k, v in store["store_samples"].items()},
        },
        "correctness": check,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    mismatched = len(check["session_mismatches"]), len(check["day_mismatches"])
    cpu_ratio = report["cold_vs_ccusage_cpu_ratio"]
    print(
        f"corpus {report['corpus_mb']} MB, {report['corpus_files']} files, "
        f"{report['sessions']} sessions, {report['tool_calls']} tool calls\n"
        + (
            f"cold  CPU {report['cold_cpu_median_s']:.3f} s vs ccusage "
            f"{report['ccusage_cpu_median_s']:.3f} s: CPU ratio {cpu_ratio:.2f} "
            f"(load average {report['load_average'][0]})\n"
            if cpu_ratio is not None
            else "cold  CPU not counted (no cgroup could be made)\n"
        )
        + f"cold  {report['cold_median_s']:.3f} s vs ccusage "
        f"{report['ccusage_session_median_s']:.3f} s: ratio {report['cold_vs_ccusage_ratio']:.2f}\n"
        f"warm  {report['warm_median_s']:.3f} s "
        f"(ratio to cold {report['warm_vs_cold_ratio']:.2f})\n"
        f"store {report['store_sessions']} sessions in {report['store_sessions_median_s']:.3f} s, "
        f"{report['store_tool_calls']} tool calls in {report['store_tool_calls_median_s']:.3f} s "
        f"(first read {report['store_first_read_median_s']:.3f} s, one butler's week "
        f"{report['store_filtered_median_s']:.3f} s) vs read_sql "
        f"{report['store_read_sql_baseline_s']:.3f} s: "
        f"ratio {report['store_vs_read_sql_ratio']:.2f}\n"
        f"vs ccusage: {mismatched[0]} of {check['sessions']} sessions and {mismatched[1]} of "
        f"{check['days']} days differ in tokens\nwrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
