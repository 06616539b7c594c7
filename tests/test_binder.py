"""The Binder set-up builds, every notebook's imports resolve in it, and Binder's default page
(the quickstart) runs in it (scripts/check-binder, no Docker). Every notebook runs under nbval
in the dev environment; running them all again here cost five minutes of CI a run."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from .conftest import REPO

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(shutil.which("python3.11") is None, reason="Binder's Python is missing"),
]


def test_binder_environment_imports_every_notebook_and_runs_the_quickstart() -> None:
    # A temp folder of its own that other users can pass through, as /tmp (the team
    # notebook's PostgreSQL runs as another user; pytest's tmp_path is the owner's only).
    scratch_tmp = Path(tempfile.mkdtemp(prefix="spawnkit-binder-tmp-"))
    scratch_tmp.chmod(0o1777)
    try:
        done = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "check-binder"),
             "--notebook", "quickstart.ipynb"],
            capture_output=True, text=True, timeout=1100, check=False,
            env={**os.environ, "TMPDIR": str(scratch_tmp)},
        )  # fmt: skip
        # Nothing is left: the environment, nor any notebook's scratch folder.
        left = sorted(p.name for p in scratch_tmp.iterdir())
    finally:
        shutil.rmtree(scratch_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert left == []
    assert "imports found" in done.stdout
    assert "ran quickstart.ipynb" in done.stdout
    assert "repo2docker: Python 3.11" in done.stdout


def test_the_imports_check_names_what_the_environment_lacks(tmp_path: Path) -> None:
    """The check the Binder test relies on for every notebook it does not run can fail:
    an import (plain, ``from``, inside a line magic's cell) of a module that is not
    installed is named; a cell magic's body is not Python and is not read."""
    imports = runpy.run_path(str(REPO / "scripts" / "check-binder"))["IMPORTS"]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("%load_ext spawnkit\nstatus = %spawn_status\nimport json"),
        nbformat.v4.new_code_cell("from no_such_module_here import thing"),
        nbformat.v4.new_code_cell("%%spawn --butler health\nimport this is a prompt"),
        nbformat.v4.new_markdown_cell("import not_code"),
    ]
    nbformat.write(notebook, tmp_path / "a.ipynb")
    done = subprocess.run(
        [sys.executable, "-c", imports, str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "not installed in the Binder environment: a.ipynb: no_such_module_here "
        "(No module named 'no_such_module_here')"
    )
    (tmp_path / "a.ipynb").unlink()
    notebook.cells = notebook.cells[:1]
    nbformat.write(notebook, tmp_path / "b.ipynb")
    done = subprocess.run(
        [sys.executable, "-c", imports, str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "imports found\n"), done.stderr
