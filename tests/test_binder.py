"""The Binder set-up builds and every notebook runs in it (scripts/check-binder, no Docker)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(shutil.which("python3.11") is None, reason="Binder's Python is missing"),
]


def test_binder_environment_runs_every_notebook() -> None:
    # A temp folder of its own that other users can pass through, as /tmp (the team
    # notebook's PostgreSQL runs as another user; pytest's tmp_path is the owner's only).
    scratch_tmp = Path(tempfile.mkdtemp(prefix="spawnkit-binder-tmp-"))
    scratch_tmp.chmod(0o1777)
    try:
        done = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "check-binder")],
            capture_output=True, text=True, timeout=1100, check=False,
            env={**os.environ, "TMPDIR": str(scratch_tmp)},
        )  # fmt: skip
        # Nothing is left: the environment, nor any notebook's scratch folder.
        left = sorted(p.name for p in scratch_tmp.iterdir())
    finally:
        shutil.rmtree(scratch_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert left == []
    tracked = subprocess.run(
        ["git", "ls-files", "notebooks/*.ipynb"], capture_output=True, text=True, cwd=REPO,
        check=True,
    ).stdout.split()  # fmt: skip
    notebooks = [name.split("/")[-1] for name in tracked]
    assert notebooks, "the repository has notebooks"
    for name in notebooks:
        assert f"ran {name}" in done.stdout
    assert "repo2docker: Python 3.11" in done.stdout
