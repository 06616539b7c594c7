"""Every shell example in the README and docs/ that uses the replay model runs as written, and
so does every Python example of the README that needs no model key.

The blocks are extracted from the Markdown itself, so an example that drifts from the
code fails here. Each runs with bash (``set -euo pipefail``) in a fresh folder that holds
the example roster, as in a checkout (an example that runs ``spawnkit init`` starts empty),
with this environment's ``spawnkit`` on PATH.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.e2e

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```", re.S | re.M)


def replay_blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for number, match in enumerate(_BLOCK.finditer(doc.read_text()), 1):
            if "--replay" in match.group(1):
                found.append((f"{doc.relative_to(REPO)}#{number}", match.group(1)))
    return found


BLOCKS = replay_blocks()


def test_the_docs_have_replay_examples() -> None:
    where = {name.split("#")[0] for name, _ in BLOCKS}
    assert {"README.md", "docs/adapter-contract.md"} <= where


@pytest.mark.parametrize(("name", "block"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_a_replay_example_runs_as_written(name: str, block: str, tmp_path: Path) -> None:
    if "spawnkit init" not in block:  # an init example starts from an empty folder
        (tmp_path / "roster").symlink_to(REPO / "roster", target_is_directory=True)
    bin_dir = str(Path(sys.executable).parent)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
        env={**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"]},
    )  # fmt: skip
    assert done.returncode == 0, f"{name}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr and "error:" not in done.stderr
    if (tmp_path / "result.json").exists():
        assert json.loads((tmp_path / "result.json").read_text())["success"] is True
    if (tmp_path / "state.json").exists():
        state = json.loads((tmp_path / "state.json").read_text())
        assert state["spawnkit"]["status"] in ("completed", "active", "pending")
        assert "completed" in done.stdout


_PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# Python examples that need a real model key: `spawnkit.map` has no replay switch yet.
NEEDS_A_KEY = ("spawnkit.map(",)


def python_blocks() -> list[tuple[str, str]]:
    found = []
    for number, match in enumerate(_PYTHON.finditer((REPO / "README.md").read_text()), 1):
        if not any(marker in match.group(1) for marker in NEEDS_A_KEY):
            found.append((f"README.md#python{number}", match.group(1)))
    return found


PYTHON_BLOCKS = python_blocks()


def test_the_readme_has_python_examples_that_run_offline() -> None:
    assert len(PYTHON_BLOCKS) >= 2, [name for name, _ in PYTHON_BLOCKS]


@pytest.mark.parametrize(("name", "block"), PYTHON_BLOCKS, ids=[n for n, _ in PYTHON_BLOCKS])
def test_a_python_example_runs_as_written(name: str, block: str, tmp_path: Path) -> None:
    """In a folder with the example roster, a home of its own, and no model key."""
    (tmp_path / "roster").symlink_to(REPO / "roster", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(HOME=str(tmp_path / "home"), SPAWNKIT_HOME=str(tmp_path / "spawnkit-home"))
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", block],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, f"{name}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
    if "print(result.success" in block:  # the run itself succeeded, on the replay model
        assert done.stdout.splitlines()[-1].startswith("True "), done.stdout[-2000:]
