"""benchmarks/cli_telemetry_source.py stays runnable: one round, results written, and the
CLI sends exactly the signals each variant chose (Codex against a receiver that decodes
nothing). How much each costs is not asserted (docs/benchmarks.md keeps full runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.e2e


def test_cli_telemetry_source_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "cli_telemetry_source.py"), "--rounds", "1",
         "--runtime", "codex", "--variants", "off,logs", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["rounds"] == 1 and len(report["load_average"]) == 6
    off, logs = report["variants"]["off"], report["variants"]["logs"]
    assert off["sent"] == {} and off["extra_cpu_s"] == 0
    assert set(logs["sent"]) == {"logs_requests", "logs_bytes"}, "only the chosen signal"
    assert logs["sent"]["logs_bytes"] > 1000
    assert off["cpu_median_s"] > 0.05 and logs["cpu_median_s"] > 0.05, "the CLI's CPU is counted"
    extra = logs["cpu_median_s"] - off["cpu_median_s"]  # one round: the one difference
    assert logs["extra_cpu_s"] == pytest.approx(extra, abs=2e-4)
    assert "codex logs: CPU per run" in done.stdout
