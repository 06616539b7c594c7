"""notebooks/analysis.ipynb runs top to bottom on a real store and real-shaped transcripts.

The kernel gets its own SPAWNKIT_HOME (a store written through SessionStore) and
CLAUDE_CONFIG_DIR (a small synthetic corpus); the test requires no error and the plots.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from spawnkit.store import SessionStore

from .conftest import REPO
from .test_history_store import record

sys.path.insert(0, str(REPO / "benchmarks"))
import gen_transcripts

NOTEBOOK = REPO / "notebooks" / "analysis.ipynb"


def run_notebook(env: dict[str, str], cwd: Path) -> list[dict[str, object]]:
    """Execute the notebook in a fresh kernel; any failing cell raises CellExecutionError."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})  # fmt: skip
    client.execute(env={**os.environ, "MPLBACKEND": "agg", **env})
    return [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]


def test_analysis_notebook_runs_and_plots(tmp_path: Path, isolated_home: Path) -> None:
    with SessionStore() as store:
        start = datetime(2026, 10, 1, 12, tzinfo=UTC)
        for i in range(12):
            record(store, f"s{i}", butler=("health", "general")[i % 2], success=i % 5 != 0,
                   at=start + timedelta(hours=9 * i), cost=None if i % 3 else 0.2)  # fmt: skip
    gen_transcripts.generate(tmp_path / "claude", 2, seed=5)
    outputs = run_notebook(
        {"SPAWNKIT_HOME": str(isolated_home), "CLAUDE_CONFIG_DIR": str(tmp_path / "claude")},
        tmp_path,
    )
    images = [out for out in outputs if "image/png" in out.get("data", {})]  # type: ignore[operator]
    assert len(images) >= 6
    text = "".join(str(out.get("text", "")) for out in outputs)
    assert "store: 12 sessions, 24 tool calls" in text and "unparseable lines" in text


def test_analysis_notebook_runs_with_no_history(tmp_path: Path) -> None:
    """As in Binder: a scratch HOME, no store, no transcripts."""
    env = {"HOME": str(tmp_path), "SPAWNKIT_HOME": str(tmp_path / "spawnkit"),
           "CLAUDE_CONFIG_DIR": ""}  # fmt: skip
    text = "".join(str(out.get("text", "")) for out in run_notebook(env, tmp_path))
    assert "store: 0 sessions" in text and "No history yet" in text
