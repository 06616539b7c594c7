"""notebooks/session_analysis.ipynb analyses the demo history it ships with, and nothing else.

nbval compares its saved text outputs; this test checks what nbval does not: that the kernel
reads no folder but the notebook's scratch copy of ``notebooks/data/history-demo`` (not the
user's ``~/.claude``, whatever the HOME), the plots (the waterfall of one run among them), and
that every demo run has the CLI's telemetry the timing tables read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from .conftest import REPO

pytestmark = pytest.mark.e2e

NOTEBOOK = REPO / "notebooks" / "session_analysis.ipynb"
FIXTURES = REPO / "tests" / "fixtures" / "history"


def test_analysis_notebook_reads_only_its_demo_data_and_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A HOME with transcripts of its own: the notebook must not count them.
    home = tmp_path / "home"
    shutil.copytree(FIXTURES / "claude", home / ".claude")
    shutil.copytree(FIXTURES / "codex", home / ".codex")
    monkeypatch.setenv("HOME", str(home))
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "GEMINI_CLI_HOME"):
        monkeypatch.delenv(name, raising=False)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    saved = [cell.outputs for cell in notebook.cells if cell.cell_type == "code"]
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )  # fmt: skip
    client.execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(images) == 7, "per butler, per model, sub-agents, tools, durations (2), waterfall"
    text = "".join(str(out.get("text", "")) for out in outputs)
    assert "40 runs from 2026-11-09 to 2026-11-18" in text
    assert "8 with a sub-agent; 0 unparseable lines" in text
    # The CLIs' own telemetry of every run: each model request and tool call it reported.
    assert "model requests and" in text and "tool calls in 40 runs" in text
    # The same tables as the saved outputs, so nothing from this HOME was read.
    fresh = [cell.outputs for cell in notebook.cells if cell.cell_type == "code"]
    for before, after in zip(saved, fresh, strict=True):
        tables = [[o.get("text"), o.get("data", {}).get("text/plain")] for o in before]
        assert tables == [[o.get("text"), o.get("data", {}).get("text/plain")] for o in after]
