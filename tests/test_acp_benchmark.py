"""benchmarks/acp_runtime.py stays runnable: one round, results written, sane numbers.

The ratio is not asserted (a shared machine may be slow); the figures of full runs go in
the lead's docs/benchmarks.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.e2e


def test_acp_runtime_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "acp_runtime.py"), "--rounds", "1",
         "--agents", "codex-acp", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (report,) = json.loads(out.read_text())["agents"].values()
    assert report["rounds"] == 1 and report["agent_version"]
    assert report["direct_median_s"] > 0 and report["spawnkit_median_s"] > 0
    assert report["ratio"] == pytest.approx(
        report["spawnkit_median_s"] / report["direct_median_s"], abs=0.002
    )
    assert report["spawnkit_own_cpu_s"] > 0
    assert report["paired"]["wall"]["median"] == pytest.approx(report["ratio"], abs=0.002)
