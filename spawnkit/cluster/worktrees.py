"""Throw-away git worktrees: one copy of a repository per run, and the diff it leaves.

``spawnkit.map(..., repo=PATH)`` gives every run its own worktree of ``PATH`` at its
``HEAD`` (detached, so no branch is created), lets the agent edit it, keeps what it
changed as a diff (``git diff --binary`` against that commit, new files included), and
removes the worktree. The repository itself is untouched: its working tree, index and
branches never change, and its ``.git/worktrees`` entries are pruned afterwards. The user
then applies the diff they choose with :func:`apply_diff` (in :mod:`spawnkit.worktree`, with
the git plumbing ``Spawner.trigger(repo=...)`` shares).

Uncommitted changes of the repository are not in the worktrees (they start at ``HEAD``);
:func:`base_commit` says which commit that is, and whether the repository was dirty.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..worktree import DIFF_OPTIONS, DiffDoesNotApply, apply_diff
from ..worktree import git as _git

__all__ = ["Base", "DiffDoesNotApply", "Worktrees", "apply_diff", "base_commit"]


@dataclass(frozen=True)
class Base:
    """The commit the worktrees start from, and whether the repository had other changes."""

    repo: Path
    commit: str
    dirty: bool


def base_commit(repo: str | Path) -> Base:
    """The repository's top folder and ``HEAD``; a clear error when it is not a git repo."""
    path = Path(repo).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"repo: {path} is not a directory")
    try:
        top = Path(_git(path, "rev-parse", "--show-toplevel").decode().strip())
        commit = _git(top, "rev-parse", "--verify", "HEAD^{commit}").decode().strip()
    except ConfigError as exc:
        raise ConfigError(f"repo: {path} is not a git repository with a commit ({exc})") from exc
    dirty = bool(_git(top, "status", "--porcelain", "--untracked-files=no").strip())
    return Base(top, commit, dirty)


class Worktrees:
    """The worktrees of one batch, in one temporary folder removed with the last of them."""

    def __init__(self, base: Base) -> None:
        self.base = base
        self.root = Path(tempfile.mkdtemp(prefix="spawnkit-worktrees-"))
        # Each worktree's git folder, read when it is made: the agent can rewrite the
        # worktree's .git file, and git must not follow it afterwards (spawnkit.worktree).
        self._made: dict[Path, Path] = {}

    def add(self, name: str) -> Path:
        """A new worktree at the base commit, detached."""
        path = self.root / name
        _git(self.base.repo, "worktree", "add", "--detach", "--quiet", str(path), self.base.commit)
        git_dir = _git(path, "rev-parse", "--absolute-git-dir").decode().strip()
        self._made[path] = Path(git_dir)
        return path

    def diff(self, path: Path) -> str:
        """What the run changed in ``path``: tracked edits, deletions and new files."""
        # Intent-to-add makes new files show in the diff without touching the index's
        # content; the worktree has its own index, so the repository's is untouched.
        git_dir = self._made[path]
        _git(path, "add", "--intent-to-add", "--all", git_dir=git_dir)
        diff = _git(path, "diff", *DIFF_OPTIONS, self.base.commit, git_dir=git_dir)
        return diff.decode(errors="replace")

    def remove(self, path: Path) -> None:
        """Remove one worktree (never raises: a batch's rows matter more than its cleanup).

        Its folder is deleted, then pruned from the repository: ``git worktree remove``
        would read the worktree's .git file, which the agent could have rewritten.
        """
        shutil.rmtree(path, ignore_errors=True)
        self._made.pop(path, None)
        with contextlib.suppress(ConfigError):
            _git(self.base.repo, "worktree", "prune")

    def close(self) -> None:
        for path in list(self._made):
            self.remove(path)
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(ConfigError):
            _git(self.base.repo, "worktree", "prune")

    def __enter__(self) -> Worktrees:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
