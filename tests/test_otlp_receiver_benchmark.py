"""benchmarks/otlp_receiver.py stays runnable: one small batch, results written, the captured
Codex run's requests replayed for each choice. How much they cost is not asserted
(docs/benchmarks.md keeps full runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not (REPO / "node_modules" / ".bin" / "codex").exists(), reason="npm ci"),
]


def test_otlp_receiver_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "otlp_receiver.py"), "--runs", "2",
         "--batches", "1", "--choices", "logs,all", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["load_average"]) == 6
    logs, everything = report["choices"]["logs"], report["choices"]["all"]
    assert logs["requests"] == 1 and everything["requests"] > logs["requests"]
    assert everything["bytes"] > logs["bytes"] > 1000
    assert logs["cpu_per_run_ms"] > 0 and everything["cpu_per_run_ms"] > 0
    assert "logs: 1 requests" in done.stdout
