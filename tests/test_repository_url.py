"""The repository's URL is one setting (pyproject's [project.urls] Repository); the Binder
links in the docs follow it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from .conftest import REPO

SCRIPT = Path("scripts") / "sync-repository-url"


def sync(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / SCRIPT), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_docs_follow_the_setting() -> None:
    done = sync(REPO, "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    with open(REPO / "pyproject.toml", "rb") as fh:
        url = tomllib.load(fh)["project"]["urls"]["Repository"]
    owner_name = url.removeprefix("https://github.com/")
    readme = (REPO / "README.md").read_text()
    assert readme.count(f"https://mybinder.org/v2/gh/{owner_name}/HEAD") >= 2


def test_changing_the_setting_moves_every_link(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / SCRIPT, tmp_path / SCRIPT)
    pyproject = tmp_path / "pyproject.toml"
    text = pyproject.read_text()
    with open(pyproject, "rb") as fh:
        old = tomllib.load(fh)["project"]["urls"]["Repository"]
    pyproject.write_text(text.replace(old, "https://github.com/someone/fork"))
    stale = sync(tmp_path, "--check")
    assert stale.returncode == 1
    assert "README.md: https://mybinder.org/v2/gh/" in stale.stdout
    assert sync(tmp_path).returncode == 0
    assert sync(tmp_path, "--check").returncode == 0
    readme = (tmp_path / "README.md").read_text()
    assert "https://mybinder.org/v2/gh/someone/fork/HEAD?urlpath=lab/tree/notebooks/" in readme
    assert old.removeprefix("https://github.com/") + "/HEAD" not in readme
