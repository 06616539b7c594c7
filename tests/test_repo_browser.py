"""``%%spawn --repo`` in JupyterLab (headless Debian Chromium): the diff, then a real click
on Apply. The real Claude Code CLI edits a worktree on the replay model; the repository's
file changes only when the button is pressed. The screenshot goes to test-artifacts/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import git
from .test_browser import (
    ARTIFACTS,
    CHROMIUM,
    browser,
    free_port,
    jupyter_env,
    open_notebook,
    run_all,
    start_lab,
    stop,
    write_notebook,
)
from .test_repo_e2e import ANALYSIS, PARQUET, TOOLS

__all__ = ["browser"]  # a fixture used here

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]
SCREENSHOT = ARTIFACTS / "lab-repo-diff-apply.png"  # docs/screenshots/repo-diff-apply.png


@pytest.fixture
def lab_with_repo(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    work = tmp_path / "work"
    repo = work / "project"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "analysis.py").write_text(ANALYSIS)
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "first")
    roster = work / "roster" / "coder"
    roster.mkdir(parents=True)
    (roster / "butler.toml").write_text(
        '[butler]\nname = "coder"\nport = 18191\ndescription = "edits code"\n' + TOOLS
    )
    (roster / "CLAUDE.md").write_text("Be brief.")
    (work / "parquet.toml").write_text(PARQUET)
    write_notebook(
        work / "repo.ipynb",
        ["%load_ext spawnkit",
         "%%spawn --butler coder --roster roster --replay parquet.toml --repo project\n"
         "switch analysis.py to parquet"],
    )  # fmt: skip
    port = free_port()
    proc = start_lab(work, jupyter_env(tmp_path / "jupyter"), port)
    try:
        yield port, repo
    finally:
        stop(proc)


def test_the_diff_shows_under_the_run_and_apply_changes_the_file(
    lab_with_repo: tuple[int, Path], browser: Any
) -> None:
    port, repo = lab_with_repo
    page = open_notebook(browser, port, "repo.ipynb", height=1100)
    run_all(page)
    diff = page.locator("pre.spawnkit-diff")
    diff.wait_for(timeout=240_000)
    assert "+df = pd.read_parquet('data.parquet')" in diff.inner_text()
    added = page.locator("pre.spawnkit-diff span", has_text="+df = pd.read_parquet").first
    assert "46, 160, 67" in added.evaluate("e => getComputedStyle(e).backgroundColor")
    apply = page.get_by_role("button", name="Apply")
    apply.wait_for(timeout=60_000)
    assert git(repo, "status", "--porcelain") == "", "nothing changes before Apply"
    page.screenshot(path=str(SCREENSHOT))
    apply.click()
    page.get_by_text("Applied: analysis.py, convert.py").first.wait_for(timeout=60_000)
    assert "read_parquet" in (repo / "analysis.py").read_text()
    assert (repo / "convert.py").exists()
    assert page.get_by_role("button", name="Apply").count() == 0, "the buttons gave way"
    assert git(repo, "worktree", "list").count("\n") == 1
