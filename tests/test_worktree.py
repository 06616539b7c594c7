"""spawnkit.worktree with real git: the starting state, a binary-safe diff, a safe cleanup.

The test plays the agent's part by writing into the worktree itself; the runs of the real
CLIs are in tests/test_repo_e2e.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spawnkit import worktree
from spawnkit.worktree import Checkout, DiffDoesNotApply, RepoChange, RepoStart, apply_diff

from .conftest import git

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
LATIN1 = "café, naïve\n".encode("latin-1")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "logo.png").write_bytes(PNG)
    (repo / "notes.txt").write_bytes(LATIN1)
    (repo / "a.py").write_text("a = 1\n")
    (repo / ".gitignore").write_text("data/\n")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "first")
    return repo


def test_binary_and_latin1_changes_round_trip_byte_for_byte(repo: Path) -> None:
    checkout = Checkout(RepoStart.of(repo), "s-binary")
    path = checkout.make()
    (path / "logo.png").write_bytes(PNG[::-1])
    (path / "notes.txt").write_bytes(LATIN1 + "déjà vu\n".encode("latin-1"))
    (path / "new.bin").write_bytes(b"\x00\xff" * 100)
    change = checkout.change()
    checkout.remove()
    assert "GIT binary patch" in change.diff
    assert sorted(change.files) == ["logo.png", "new.bin", "notes.txt"]
    assert sorted(change.apply()) == ["logo.png", "new.bin", "notes.txt"]
    assert (repo / "logo.png").read_bytes() == PNG[::-1]
    assert (repo / "notes.txt").read_bytes() == LATIN1 + "déjà vu\n".encode("latin-1")
    assert (repo / "new.bin").read_bytes() == b"\x00\xff" * 100
    # The record keeps it as JSON: the diff is text that survives the trip.
    again = RepoChange.from_dict(change.to_dict())
    with pytest.raises(DiffDoesNotApply, match="already applied"):
        again.apply()


def test_the_start_is_head_plus_staged_unstaged_and_untracked_but_not_ignored(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / "a.py").write_text("a = 1\nb = 2\n")  # unstaged
    (repo / "staged.py").write_text("s = 1\n")
    git(repo, "add", "staged.py")  # staged, new
    git(repo, "rm", "-q", "notes.txt")  # staged deletion
    (repo / "draft.md").write_text("draft\n")  # untracked
    (repo / "data").mkdir()
    (repo / "data" / "big.csv").write_text("ignored\n")  # ignored
    (repo / "huge.parquet").write_bytes(b"x" * 2048)  # untracked, over the (lowered) limit
    monkeypatch.setattr(worktree, "UNTRACKED_LIMIT_BYTES", 1024)
    status = git(repo, "status", "--porcelain")

    checkout = Checkout(RepoStart.of(repo), "s-start")
    path = checkout.make()
    try:
        assert (path / "a.py").read_text() == "a = 1\nb = 2\n"
        assert (path / "staged.py").read_text() == "s = 1\n"
        assert not (path / "notes.txt").exists()
        assert (path / "draft.md").read_text() == "draft\n"
        assert not (path / "data").exists() and not (path / "huge.parquet").exists()
        assert sorted(checkout.carried) == ["a.py", "draft.md", "notes.txt", "staged.py"]
        assert checkout.left_out == ("huge.parquet",)
        assert checkout.change().diff == "", "the starting state is no change"
        (path / "a.py").write_text("a = 1\nb = 3\n")
        change = checkout.change()
    finally:
        checkout.remove()
    assert change.files == ["a.py"] and "-b = 2\n+b = 3" in change.diff
    assert git(repo, "status", "--porcelain") == status, "the repository was not touched"
    assert change.apply() == ["a.py"]
    assert (repo / "a.py").read_text() == "a = 1\nb = 3\n"
    assert git(repo, "diff", "--cached", "--name-only").split() == ["notes.txt", "staged.py"]


def test_nothing_of_the_run_is_left_in_the_repository_or_the_home(
    repo: Path, isolated_home: Path
) -> None:
    objects = sorted(p.name for p in (repo / ".git" / "objects").rglob("*"))
    (repo / "a.py").write_text("a = 'uncommitted, so its blob is new'\n")
    checkout = Checkout(RepoStart.of(repo), "s-clean")
    path = checkout.make()
    (path / "b.py").write_text("b = 1\n")
    checkout.change()
    checkout.remove()
    assert sorted(p.name for p in (repo / ".git" / "objects").rglob("*")) == objects
    assert not (repo / ".git" / "worktrees").exists()
    assert git(repo, "worktree", "list").count("\n") == 1
    assert list((isolated_home / "worktrees").iterdir()) == []


def test_a_worktree_git_file_the_agent_rewrote_is_not_followed(repo: Path, tmp_path: Path) -> None:
    """The agent may point the worktree's .git at a repository of its own whose config
    runs a program (core.fsmonitor); taking the diff must not run it."""
    evil = tmp_path / "evil"
    git(tmp_path, "init", "-q", str(evil))
    marker = tmp_path / "ran"
    git(evil, "config", "core.fsmonitor", f"touch {marker}; false")
    checkout = Checkout(RepoStart.of(repo), "s-evil")
    path = checkout.make()
    (path / ".git").write_text(f"gitdir: {evil / '.git'}\n")
    (path / "a.py").write_text("a = 2\n")
    change = checkout.change()
    checkout.remove()
    assert not marker.exists()
    assert change.files == ["a.py"]


def test_a_folder_that_is_no_repository_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(worktree.ConfigError, match=r"plain is not a git repository"):
        RepoStart.of(tmp_path / "plain")
    with pytest.raises(worktree.ConfigError, match="is not a directory"):
        RepoStart.of(tmp_path / "missing")
    empty = tmp_path / "empty"
    git(tmp_path, "init", "-q", str(empty))
    with pytest.raises(worktree.ConfigError, match="with a commit"):
        RepoStart.of(empty)


def test_an_empty_diff_applies_as_nothing(repo: Path) -> None:
    assert apply_diff("", repo) == []
    assert git(repo, "status", "--porcelain") == ""


def test_a_map_worktree_git_file_the_agent_rewrote_is_not_followed(
    repo: Path, tmp_path: Path
) -> None:
    """The same for spawnkit.map's worktrees (cluster/worktrees.py followed it before)."""
    from spawnkit.cluster.worktrees import Worktrees, base_commit

    evil = tmp_path / "evil"
    git(tmp_path, "init", "-q", str(evil))
    marker = tmp_path / "ran"
    git(evil, "config", "core.fsmonitor", f"touch {marker}; false")
    with Worktrees(base_commit(repo)) as worktrees:
        path = worktrees.add("00001")
        (path / ".git").write_text(f"gitdir: {evil / '.git'}\n")
        (path / "a.py").write_text("a = 2\n")
        diff = worktrees.diff(path)
    assert not marker.exists()
    assert "+a = 2" in diff
    assert git(repo, "worktree", "list").count("\n") == 1
