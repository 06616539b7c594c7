"""A run's own git worktree of the user's repository, and the change it leaves (``repo=``).

``Spawner.trigger(repo=PATH)`` (``spawnkit run --repo``, ``%%spawn --repo``) runs the agent
in a worktree of ``PATH`` that starts where the user is: ``HEAD`` plus every uncommitted
change (tracked modifications, staged or not, applied from ``git diff HEAD --binary``, and
copies of the untracked files that are not ignored). That starting state is written as a
git tree, and the run's diff is taken against it, so the diff holds the agent's changes
only and :meth:`RepoChange.apply` puts exactly those into the repository, where the user's
own uncommitted changes still are. During the run the repository's working tree, index and
branches never change; afterwards the worktree is deleted and ``.git/worktrees`` pruned.

Nothing is left in the repository either: the objects the starting state needs are written
to an object folder of the run's own (``GIT_OBJECT_DIRECTORY``, the repository's objects
as an alternate), deleted with the worktree. Git runs on the worktree with its git folder
named explicitly, without textconv or external diff programs: the agent can write
anything in its worktree, its ``.git`` file included, and nothing it writes chooses the
repository or the programs git uses afterwards. The worktree itself is removed by deleting
its folder (never through git), then pruning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, SpawnkitError
from .home import spawnkit_home

logger = logging.getLogger(__name__)

GIT_TIMEOUT_S = 120.0
# $SPAWNKIT_HOME/worktrees/<session id>/: a run's worktree, its objects, nothing else.
WORKTREES_DIR = "worktrees"
# Untracked files bigger than this are not copied into the worktree (a data file beside
# the code): named in the record's repo.left_out instead.
UNTRACKED_LIMIT_BYTES = 100 * 1024 * 1024
# Options every diff is made with, whatever the user's git configuration says (a
# noprefix, colour or relative setting would make a diff git apply cannot read).
DIFF_OPTIONS = (
    "--binary", "--full-index", "--no-color", "--no-ext-diff", "--no-textconv",
    "--src-prefix=a/", "--dst-prefix=b/", "--no-relative",
)  # fmt: skip
APPLY_OPTIONS = ("--binary", "--whitespace=nowarn")


class DiffDoesNotApply(SpawnkitError):
    """A run's diff cannot go into the repository: it moved on, or the diff is applied."""


def git(
    repo: Path,
    *args: str,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    git_dir: Path | None = None,
) -> bytes:
    """``git -C repo ARGS``'s output; a failure raises :class:`ConfigError` with git's
    last line. ``git_dir`` names the git folder instead of finding it from ``repo``."""
    where = ["--git-dir", str(git_dir), "--work-tree", str(repo)] if git_dir else []
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *where, *args],
            input=input,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0", **(env or {})},
        )
    except FileNotFoundError as exc:
        raise ConfigError("git is not installed (it makes the worktrees of repo=)") from exc
    if done.returncode != 0:
        raise GitFailed(args, repo, done.stderr.decode(errors="replace"))
    return done.stdout


class GitFailed(ConfigError):
    """A git command failed; ``stderr`` is all it said."""

    def __init__(self, args: Sequence[str], repo: Path, stderr: str) -> None:
        lines = stderr.strip().splitlines()
        super().__init__(f"git {' '.join(args[:2])} in {repo}: {lines[-1] if lines else ''}")
        self.stderr = stderr


@dataclass(frozen=True)
class RepoStart:
    """The repository a run edits a worktree of: its top folder, checked to have a commit."""

    repo: Path

    @classmethod
    def of(cls, repo: str | Path) -> RepoStart:
        """The repository ``repo`` is in; a one-line :class:`ConfigError` when it is none."""
        path = Path(repo).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(f"repo: {path} is not a directory")
        try:
            top = Path(git(path, "rev-parse", "--show-toplevel").decode().strip())
            git(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        except ConfigError:
            raise ConfigError(
                f"repo: {path} is not a git repository with a commit (git init, then commit)"
            ) from None
        return cls(top)


@dataclass(frozen=True)
class RepoChange:
    """What a run changed in its worktree of ``repo``: ``diff``, a binary-safe git diff
    against its starting state (``base_commit`` plus the ``carried`` uncommitted files)."""

    repo: Path
    base_commit: str
    diff: str
    carried: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()

    @property
    def files(self) -> list[str]:
        """The paths the diff touches, as its ``diff --git`` lines name them."""
        return diff_files(self.diff)

    def stat(self) -> str:
        """git's diff stat of the change (``git apply --stat``); "" for no change."""
        if not self.diff.strip():
            return ""
        return git(self.repo, "apply", "--stat", *APPLY_OPTIONS, input=_patch(self.diff)).decode()

    def apply(self) -> list[str]:
        """Put the change into the repository's working tree; the paths it touched.

        Refused with :class:`DiffDoesNotApply`, naming the files, when the repository moved
        on where the run changed it, or already has the change (an apply done twice).
        """
        return apply_diff(self.diff, self.repo)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["repo"] = str(self.repo)
        data["carried"], data["left_out"] = list(self.carried), list(self.left_out)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RepoChange:
        return cls(
            repo=Path(data["repo"]),
            base_commit=str(data["base_commit"]),
            diff=str(data.get("diff") or ""),
            carried=tuple(data.get("carried") or ()),
            left_out=tuple(data.get("left_out") or ()),
        )


def worktree_folder(session_id: str) -> Path:
    """Where run ``session_id``'s worktree and objects live (the sweep's to remove too)."""
    return spawnkit_home() / WORKTREES_DIR / session_id


class Checkout:
    """One run's worktree: made at the repository's current state, diffed, removed."""

    def __init__(self, start: RepoStart, session_id: str) -> None:
        self.repo = start.repo
        self.folder = worktree_folder(session_id)
        self.path = self.folder / (self.repo.name or "repo")
        self._objects = self.folder / "objects"
        self._git_dir: Path | None = None
        self.base_commit = ""
        self.start_tree = ""
        self.carried: tuple[str, ...] = ()
        self.left_out: tuple[str, ...] = ()

    def make(self) -> Path:
        """Create the worktree at ``HEAD`` with the uncommitted changes; its path.

        What fails half-way is removed before the error goes on.
        """
        try:
            self._make()
        except BaseException:
            self.remove()
            raise
        return self.path

    def _make(self) -> None:
        self.folder.mkdir(parents=True, mode=0o700)
        self._objects.mkdir()
        with contextlib.suppress(ConfigError):
            git(self.repo, "worktree", "prune")  # entries a crashed run left
        self.base_commit = git(self.repo, "rev-parse", "HEAD").decode().strip()
        git(self.repo, "worktree", "add", "--detach", "--quiet", str(self.path), self.base_commit)
        # Read now, before the agent can touch the worktree's .git file.
        self._git_dir = Path(git(self.path, "rev-parse", "--absolute-git-dir").decode().strip())
        tracked = git(self.repo, "diff", *DIFF_OPTIONS, "HEAD")
        if tracked.strip():
            self._git("apply", *APPLY_OPTIONS, input=tracked)
        self.carried = tuple(diff_files(tracked.decode(errors="replace")))
        untracked = git(self.repo, "ls-files", "--others", "--exclude-standard", "-z")
        copied, left_out = self._copy_untracked(os.fsdecode(untracked).split("\0"))
        self.carried += tuple(copied)
        self.left_out = tuple(left_out)
        self._git("add", "--all")
        self.start_tree = self._git("write-tree").decode().strip()

    def _copy_untracked(self, names: list[str]) -> tuple[list[str], list[str]]:
        copied: list[str] = []
        left_out: list[str] = []
        for name in names:
            if not name or name.endswith("/"):  # a nested repository: not ours to copy
                continue
            source, target = self.repo / name, self.path / name
            try:
                info = source.lstat()
            except OSError:  # gone since git listed it
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size > UNTRACKED_LIMIT_BYTES:
                left_out.append(name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if stat.S_ISLNK(info.st_mode):
                target.symlink_to(source.readlink())
            elif stat.S_ISREG(info.st_mode):
                shutil.copy2(source, target, follow_symlinks=False)
            else:
                continue
            copied.append(name)
        return copied, left_out

    def change(self, redact: Any = None) -> RepoChange:
        """What the run changed since the start: tracked edits, deletions, new files."""
        self._git("add", "--intent-to-add", "--all")
        diff = self._diff_text()
        if redact is not None:
            diff = redact(diff)
        return RepoChange(self.repo, self.base_commit, diff, self.carried, self.left_out)

    def _diff_text(self) -> str:
        raw = self._git("diff", *DIFF_OPTIONS, self.start_tree)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            pass
        # Text files in another encoding than UTF-8: diffed as binary, so the diff is text.
        names = os.fsdecode(self._git("diff", "--name-only", "-z", self.start_tree)).split("\0")
        patterns = [
            "/" + re.sub(r"[\s*?\[\\]", "?", name) + " binary\n"
            for name in names
            if name and not _decodes(self._git("diff", *DIFF_OPTIONS, self.start_tree,
                                                "--", f":(literal){name}"))
        ]  # fmt: skip
        with tempfile.NamedTemporaryFile("w", suffix=".gitattributes", delete=False) as file:
            file.write("".join(patterns))
        try:
            raw = self._git("-c", f"core.attributesFile={file.name}", "diff", *DIFF_OPTIONS,
                            self.start_tree)  # fmt: skip
        finally:
            Path(file.name).unlink()
        return raw.decode(errors="replace")

    def _git(self, *args: str, input: bytes | None = None) -> bytes:
        assert self._git_dir is not None
        objects = {
            "GIT_OBJECT_DIRECTORY": str(self._objects),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(self._git_dir.parent.parent / "objects"),
        }
        common = self._git_dir / "commondir"
        if common.is_file():
            shared = (self._git_dir / common.read_text().strip()).resolve()
            objects["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(shared / "objects")
        return git(self.path, *args, input=input, env=objects, git_dir=self._git_dir)

    def remove(self) -> None:
        """Delete the worktree and its objects, and prune the repository's entry of it.

        Never raises: a run's record matters more than its cleanup (what is left is
        logged, and the sweep or the next run's prune takes it).
        """
        if self.folder.exists():
            shutil.rmtree(self.folder, onerror=_writable_then_retry)
        try:
            git(self.repo, "worktree", "prune")
        except ConfigError as exc:
            logger.warning("could not prune the worktrees of %s: %s", self.repo, exc)
        if self.folder.exists():
            logger.warning("could not remove the worktree folder %s", self.folder)


def _writable_then_retry(function: Any, path: str, _: Any) -> None:
    """An agent may leave read-only folders: make the parent writable and try again."""
    target = Path(path)
    with contextlib.suppress(OSError):
        target.parent.chmod(0o700)
        if target.is_dir() and not target.is_symlink():
            target.chmod(0o700)
        function(path)


def _decodes(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


_DIFF_HEADER = re.compile(r"^diff --git a/(.*) b/(.*)$", re.MULTILINE)
_PATCH_FAILED = re.compile(r"^error: patch failed: (.+):\d+$", re.MULTILINE)
_FILE_REFUSED = re.compile(
    r"^error: (.+?): (?:patch does not apply|already exists in working directory|"
    r"No such file or directory|does not exist in index|wrong type|does not match index)",
    re.MULTILINE,
)


def diff_files(diff: str) -> list[str]:
    """The paths a git diff touches, in order (the new name of a renamed file)."""
    return list(dict.fromkeys(match.group(2) for match in _DIFF_HEADER.finditer(diff)))


def apply_diff(diff: str, repo: str | Path) -> list[str]:
    """Apply a run's diff to ``repo``'s working tree; the paths it touched.

    Checked first: a diff that does not apply (the repository changed where the run did),
    or that the repository already has (applied before), changes nothing and raises
    :class:`DiffDoesNotApply` naming the files. An empty diff changes nothing.
    """
    path = Path(repo).expanduser().resolve()
    if not diff.strip():
        return []
    data = _patch(diff)
    files = diff_files(diff)
    if _applies(path, data, "--reverse"):
        raise DiffDoesNotApply(
            f"the diff is already applied to {path} ({', '.join(files)} already "
            f"{'has' if len(files) == 1 else 'have'} its changes); nothing was changed"
        )
    try:
        git(path, "apply", "--check", *APPLY_OPTIONS, input=data)
    except GitFailed as failed:
        named = list(dict.fromkeys(
            [*_PATCH_FAILED.findall(failed.stderr), *_FILE_REFUSED.findall(failed.stderr)]
        )) or files  # fmt: skip
        raise DiffDoesNotApply(
            f"the diff does not apply to {path}: {', '.join(named)} changed since the run "
            f"started; nothing was changed ({str(failed).rsplit(': ', 1)[-1]})"
        ) from None
    git(path, "apply", *APPLY_OPTIONS, input=data)
    return files


def _patch(diff: str) -> bytes:
    return (diff if diff.endswith("\n") else diff + "\n").encode()


def _applies(repo: Path, data: bytes, *options: str) -> bool:
    try:
        git(repo, "apply", "--check", *APPLY_OPTIONS, *options, input=data)
    except GitFailed:
        return False
    return True
