"""benchmarks/history.py stays runnable: one small round, results written, sane figures.

Ratios are not asserted (a shared machine may be slow); docs/benchmarks.md keeps the figures
of full runs. Correctness is: the per-day totals equal ccusage's.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO


def test_history_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "history.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "history.py"), "--size-mb", "4", "--rounds",
         "1", "--store-sessions", "2000", "--work", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["rounds"] == 1 and report["corpus_mb"] >= 4
    assert report["store_sessions"] == 2000 and report["store_tool_calls"] == 20_000
    for key in ("cold_median_s", "ccusage_session_median_s", "warm_median_s", "store_median_s",
                "store_first_read_median_s", "store_read_sql_baseline_s"):  # fmt: skip
        assert report[key] > 0
    # One butler of five, over the whole (short) store.
    assert report["store_filtered_tool_calls"] == 20_000 // 5
    samples = report["samples"]
    assert report["cold_vs_ccusage_ratio"] == pytest.approx(
        statistics.median(samples["cold"]) / statistics.median(samples["ccusage"]), abs=0.002
    )
    # CPU counted for both sides where a cgroup could be made (None where it could not).
    cpu = report["cold_vs_ccusage_cpu_ratio"]
    if cpu is not None:
        assert report["cold_cpu_median_s"] > 0 and report["ccusage_cpu_median_s"] > 0
        assert cpu == pytest.approx(
            statistics.median(samples["cold_cpu"]) / statistics.median(samples["ccusage_cpu"]),
            abs=0.002,
        )
        assert "CPU ratio" in done.stdout
    check = report["correctness"]
    assert check["day_mismatches"] == [] and check["session_differences_equal_that_gap"]
    assert "ratio" in done.stdout


def test_store_first_read_benchmark_runs(tmp_path: Path) -> None:
    """benchmarks/store_first_read.py: one small round on both backends, figures sane."""
    out = tmp_path / "first.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "store_first_read.py"), "--sessions", "300",
         "--calls", "3", "--rounds", "1", "--out", str(out), "--work", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    for backend in ("sqlite", "postgresql"):
        for kind, rows in (("sessions", 300), ("tool_calls", 900)):
            figures = report[backend][kind]
            for side in ("first", "warm"):
                assert figures[side]["rows"] == rows
                assert figures[side]["cpu_s"] > 0 and figures[side]["rss_mb"] > 0
            assert figures["first_vs_warm_cpu"] > 0


def test_two_builds_cold_benchmark_runs(tmp_path: Path) -> None:
    """benchmarks/history_cold.py stays runnable: this checkout against a copy of itself,
    one small round, the same token totals both ways (it refuses to report otherwise)."""
    baseline = tmp_path / "baseline"
    shutil.copytree(REPO / "spawnkit", baseline / "spawnkit")
    out = tmp_path / "history_cold_ab.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "history_cold.py"), "--spawnkit-from",
         str(baseline), "--size-mb", "2", "--rounds", "1", "--work", str(tmp_path / "work"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["rounds"] == 1 and report["tokens"] > 0
    assert report["baseline"] == str(baseline.resolve())
    for side in ("ccusage", "baseline", "this"):
        assert report[f"{side}_cpu_median_s"] > 0
