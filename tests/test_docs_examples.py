"""Every shell example in docs/ that uses the replay model runs as written (the README's
blocks, all of them, run from the wheel in tests/test_readme.py).

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

DOCS = sorted((REPO / "docs").glob("*.md"))
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
    assert {"docs/adapter-contract.md"} <= where


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
