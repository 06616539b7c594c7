"""notebooks/session_analysis.ipynb makes its own history offline, then analyses and plots it.

nbval compares its saved text outputs; this test checks what nbval does not: the plots.
"""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from .conftest import REPO

pytestmark = pytest.mark.e2e

NOTEBOOK = REPO / "notebooks" / "session_analysis.ipynb"


def test_analysis_notebook_runs_and_plots() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )  # fmt: skip
    client.execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(images) == 4, "cost per day, tool calls, durations, tool durations"
    text = "".join(str(out.get("text", "")) for out in outputs)
    assert "found 3 of our 3 Claude Code runs; 0 unparseable lines" in text
