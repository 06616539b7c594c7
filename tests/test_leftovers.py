"""Tests and notebooks leave no scratch folders behind in the temp folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def pytest_in(scratch_tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A pytest run of this repository in a process of its own, its TMPDIR ``scratch_tmp``."""
    scratch_tmp.mkdir()
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
        env={**os.environ, "TMPDIR": str(scratch_tmp)},
    )  # fmt: skip


def test_a_test_session_removes_its_scratch_home(tmp_path: Path) -> None:
    scratch_tmp = tmp_path / "tmp"
    done = pytest_in(
        scratch_tmp, "-o", "addopts=",
        "tests/test_runtime_names.py::test_the_alias_table_maps_to_registered_runtimes",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    assert sorted(p.name for p in scratch_tmp.glob("spawnkit-tests-*")) == []


def scratch_cell(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return next(source for source in sources if "spawnkit-notebook-" in source)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])
def test_each_notebook_keeps_its_state_in_a_folder_that_is_deleted(notebook: Path) -> None:
    source = scratch_cell(notebook)
    assert 'TemporaryDirectory(prefix="spawnkit-notebook-")' in source
    assert "mkdtemp" not in notebook.read_text()


def test_a_kernel_deletes_the_notebook_scratch_folder_when_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    scratch_tmp = tmp_path / "tmp"
    scratch_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch_tmp))
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(scratch_cell(REPO / "notebooks" / "quickstart.ipynb")),
        nbformat.v4.new_code_cell(
            "from spawnkit.store import SessionStore\n"
            "SessionStore().close()\n"
            "print(os.environ['SPAWNKIT_HOME'])"
        ),
    ]
    nbclient.NotebookClient(
        notebook, timeout=120, kernel_name="python3", coalesce_streams=True
    ).execute()
    printed = notebook.cells[1].outputs[0]["text"].strip()
    assert Path(printed).parent == scratch_tmp and Path(printed).name.startswith(
        "spawnkit-notebook-"
    )
    assert list(scratch_tmp.glob("spawnkit-notebook-*")) == []


def test_a_notebook_run_under_nbval_leaves_no_scratch_folder(tmp_path: Path) -> None:
    """nbval kills each notebook's kernel (SIGKILL), so the kernel never deletes its
    scratch folder; notebooks/conftest.py gives kernels a temp folder that the test
    process removes at its end."""
    scratch_tmp = tmp_path / "tmp"
    done = pytest_in(scratch_tmp, "-p", "no:xdist", "notebooks/your_own_butler.ipynb")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "passed" in done.stdout
    assert sorted(p.name for p in scratch_tmp.iterdir()) == []
