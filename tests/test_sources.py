"""The sources registry: sources.toml, names, paths, and git sources cloned from local repos.

Git sources use repositories created with ``git init`` in tmp dirs (no network), reached
by plain path or ``file://`` URL. Every git call is bounded by the registry's timeout.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
import tomllib
from datetime import datetime
from pathlib import Path

import pytest

from spawnkit.ask import ask
from spawnkit.containment.sources import (
    GitError,
    InvalidSourceNameError,
    SourceError,
    SourceExistsError,
    SourcePathError,
    SourceRegistry,
    SourceUpdateError,
    UnknownSourceError,
    check_outside_state,
    is_git_url,
)
from spawnkit.errors import ConfigError

GIT_TIMEOUT_S = 30


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits in the test repositories need an author; HOME has no git config."""
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "spawnkit tests")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "tests@spawnkit.invalid")


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=True
    )
    return done.stdout.strip()


def make_repo(path: Path, files: dict[str, str], branch: str = "main") -> Path:
    path.mkdir(parents=True)
    git("init", "--quiet", "-b", branch, cwd=path)
    commit(path, files, "initial")
    return path


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git("add", "--all", cwd=repo)
    git("commit", "--quiet", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


@pytest.fixture
def registry(isolated_home: Path) -> SourceRegistry:
    return SourceRegistry(git_timeout_s=GIT_TIMEOUT_S)


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("buy milk\n")
    return folder


def test_directory_and_file_sources_persist_in_sources_toml(
    registry: SourceRegistry, notes: Path, tmp_path: Path, isolated_home: Path
) -> None:
    single = tmp_path / "single.md"
    single.write_text("one file\n")

    added_dir = registry.add("notes", notes)
    added_file = registry.add("single", str(single))

    assert (added_dir.kind, added_dir.path) == ("directory", notes.resolve())
    assert (added_file.kind, added_file.path) == ("file", single.resolve())
    assert added_dir.added_at.tzinfo is not None
    # A fresh registry (another process) reads the same file.
    again = SourceRegistry()
    assert again.list() == [added_dir, added_file]
    assert again.path == isolated_home / "sources.toml"
    data = tomllib.loads(again.path.read_text())
    assert data["sources"]["notes"] == {
        "kind": "directory",
        "path": str(notes.resolve()),
        "added_at": added_dir.added_at,
    }
    assert data["sources"]["single"]["kind"] == "file"
    assert isinstance(data["sources"]["single"]["added_at"], datetime)


def test_list_is_sorted_and_remove_leaves_the_files(registry: SourceRegistry, notes: Path) -> None:
    registry.add("zeta", notes)
    registry.add("alpha", notes)
    assert [s.name for s in registry.list()] == ["alpha", "zeta"]

    removed = registry.remove("zeta")

    assert removed.name == "zeta"
    assert [s.name for s in registry.list()] == ["alpha"]
    assert (notes / "todo.txt").read_text() == "buy milk\n"
    with pytest.raises(UnknownSourceError, match="'zeta'"):
        registry.remove("zeta")


@pytest.mark.parametrize(
    "name",
    ["Notes", "-notes", "_x", ".hidden", "a b", "a/b", "..", "", "x" * 65, "prompt.md",
     "opencode.json", "née"],
)  # fmt: skip
def test_invalid_names_are_refused(registry: SourceRegistry, notes: Path, name: str) -> None:
    with pytest.raises(InvalidSourceNameError) as info:
        registry.add(name, notes)
    assert isinstance(info.value, ConfigError)
    assert repr(name) in str(info.value)
    assert registry.list() == []
    assert not registry.path.exists()


@pytest.mark.parametrize("name", ["a", "0", "my-notes", "v1.2_docs", "x" * 64])
def test_valid_names(registry: SourceRegistry, notes: Path, name: str) -> None:
    assert registry.add(name, notes).name == name


def test_missing_path_is_refused(registry: SourceRegistry, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(SourcePathError, match="does not exist") as info:
        registry.add("gone", missing)
    assert str(missing) in str(info.value)
    assert registry.list() == []


@pytest.fixture
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's HOME holding $SPAWNKIT_HOME (``~/.spawnkit``), as it is by default."""
    home = tmp_path / "user"
    state = home / ".spawnkit"
    state.mkdir(parents=True)
    (state / "credentials.json").write_text("{}")
    (home / "notes.txt").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SPAWNKIT_HOME", str(state))
    return home


def test_a_source_may_neither_hold_nor_lie_in_spawnkit_home(user_home: Path) -> None:
    """``spawnkit sources add home ~`` would show runs the store and the credentials (and
    cover their workspaces read-only): refused, like any path inside the state folder."""
    registry = SourceRegistry()
    state = user_home / ".spawnkit"
    for name, location, where in [
        ("home", "~", "holds"), ("state", state, "holds"),
        ("creds", state / "credentials.json", "lies inside"),
    ]:  # fmt: skip
        with pytest.raises(SourcePathError, match=f"source '{name}' {where} spawnkit's own state"):
            registry.add(name, location)
    registry.add("notes", user_home / "notes.txt")
    assert [source.name for source in registry.list()] == ["notes"]


def test_the_cli_refuses_a_source_holding_spawnkit_home_in_one_line(user_home: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", "sources", "add", "home", str(user_home)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"spawnkit: error: {user_home}: source 'home' holds spawnkit's own state "
        f"({user_home / '.spawnkit'}): no run may read it"
    ]
    assert not (user_home / ".spawnkit" / "sources.toml").exists()


def test_a_source_holding_spawnkit_home_is_refused_before_a_run(user_home: Path) -> None:
    """A registry written before the check (or by hand) does not get the source to a run."""
    (user_home / ".spawnkit" / "sources.toml").write_text(
        f'[sources.home]\nkind = "directory"\npath = "{user_home}"\n'
        "added_at = 2026-01-01T00:00:00Z\n"
    )
    with pytest.raises(SourcePathError, match="source 'home' holds spawnkit's own state"):
        asyncio.run(ask("home", "what is in my home?", runtime="claude-code"))
    assert not (user_home / ".spawnkit" / "workspaces").exists(), "no run was started"


def test_a_git_sources_clone_inside_spawnkit_home_is_allowed(
    registry: SourceRegistry, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "upstream", {"README.md": "hello\n"})
    source = registry.add("upstream", repo, kind="git")
    assert source.path.is_relative_to(registry.home)
    check_outside_state(source, registry.home)


def test_duplicate_name_is_refused(registry: SourceRegistry, notes: Path, tmp_path: Path) -> None:
    registry.add("notes", notes)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(SourceExistsError, match="'notes' already exists"):
        registry.add("notes", other)
    assert registry.get("notes").path == notes.resolve()


def test_explicit_kind_must_match_the_path(
    registry: SourceRegistry, notes: Path, tmp_path: Path
) -> None:
    with pytest.raises(SourcePathError, match="is a directory, not a file"):
        registry.add("notes", notes, kind="file")
    with pytest.raises(SourceError, match="branch applies to git sources only"):
        registry.add("notes", notes, branch="main")
    with pytest.raises(SourceError, match="unknown source kind"):
        registry.add("notes", notes, kind="svn")  # type: ignore[arg-type]


def test_resolve_names_every_unknown_source(registry: SourceRegistry, notes: Path) -> None:
    registry.add("notes", notes)
    registry.add("docs", notes)

    with pytest.raises(UnknownSourceError) as info:
        registry.resolve(["notes", "wiki", "docs", "blog", "wiki"])

    assert info.value.names == ("wiki", "blog")
    message = str(info.value)
    assert "unknown sources 'wiki', 'blog'" in message
    assert "registered: docs, notes" in message
    assert [s.name for s in registry.resolve(["docs", "notes", "docs"])] == ["docs", "notes"]


def test_unknown_source_in_an_empty_registry(registry: SourceRegistry) -> None:
    with pytest.raises(UnknownSourceError, match="unknown source 'x' \\(none are registered"):
        registry.get("x")


def test_git_source_is_cloned_and_updated_after_an_upstream_commit(
    registry: SourceRegistry, tmp_path: Path, isolated_home: Path
) -> None:
    upstream = make_repo(tmp_path / "upstream", {"README.md": "first\n"})

    source = registry.add("repo", upstream, kind="git")

    clone = isolated_home / "sources" / "git" / "repo"
    assert source.path == clone
    assert (clone / "README.md").read_text() == "first\n"
    assert source.url == str(upstream.resolve())
    assert (source.branch, source.commit) == ("main", git("rev-parse", "HEAD", cwd=upstream))
    assert source.pinned is False

    head = commit(upstream, {"NEWS.md": "second\n"}, "news")
    assert not (clone / "NEWS.md").exists()

    [updated] = registry.update("repo")

    assert (clone / "NEWS.md").read_text() == "second\n"
    assert updated.commit == head
    assert updated.updated_at is not None
    stored = tomllib.loads(registry.path.read_text())["sources"]["repo"]
    assert stored["commit"] == head
    assert stored["url"] == str(upstream.resolve())
    assert "path" not in stored  # the clone's place follows $SPAWNKIT_HOME


def test_file_url_is_a_git_source_and_update_all_skips_the_others(
    registry: SourceRegistry, tmp_path: Path, notes: Path
) -> None:
    upstream = make_repo(tmp_path / "upstream", {"a.txt": "a\n"})
    registry.add("notes", notes)
    source = registry.add("repo", f"file://{upstream}")
    assert source.kind == "git"
    commit(upstream, {"b.txt": "b\n"}, "b")

    updated = registry.update()

    assert [s.name for s in updated] == ["notes", "repo"]
    assert updated[0] == registry.get("notes")  # a directory needs nothing
    assert (source.path / "b.txt").exists()


def test_update_follows_a_changed_default_branch_and_resets_local_changes(
    registry: SourceRegistry, tmp_path: Path
) -> None:
    upstream = make_repo(tmp_path / "upstream", {"a.txt": "a\n"})
    source = registry.add("repo", upstream, kind="git")
    (source.path / "a.txt").write_text("scribbled over\n")
    git("checkout", "--quiet", "-b", "trunk", cwd=upstream)
    commit(upstream, {"t.txt": "on trunk\n"}, "trunk")

    [updated] = registry.update("repo")

    assert updated.branch == "trunk"
    assert (source.path / "t.txt").read_text() == "on trunk\n"
    assert (source.path / "a.txt").read_text() == "a\n"


def test_pinned_branch_is_kept(registry: SourceRegistry, tmp_path: Path) -> None:
    upstream = make_repo(tmp_path / "upstream", {"a.txt": "a\n"})
    git("branch", "stable", cwd=upstream)
    source = registry.add("repo", upstream, kind="git", branch="stable")
    assert (source.branch, source.pinned) == ("stable", True)
    commit(upstream, {"main-only.txt": "x\n"}, "on main")
    git("checkout", "--quiet", "stable", cwd=upstream)
    commit(upstream, {"stable.txt": "s\n"}, "on stable")

    [updated] = registry.update("repo")

    assert updated.branch == "stable"
    assert (source.path / "stable.txt").exists()
    assert not (source.path / "main-only.txt").exists()


def test_git_clone_failure_carries_gits_stderr(
    registry: SourceRegistry, tmp_path: Path, isolated_home: Path
) -> None:
    not_a_repo = tmp_path / "plain"
    not_a_repo.mkdir()

    with pytest.raises(GitError) as info:
        registry.add("broken", f"file://{not_a_repo}")

    error = info.value
    assert error.returncode not in (0, None)
    assert "not appear to be a git repository" in error.stderr
    assert error.stderr.strip() in str(error)
    assert registry.list() == []
    assert not (isolated_home / "sources" / "git" / "broken").exists()
    assert list((isolated_home / "sources" / "git").iterdir()) == []


def test_git_update_failure_carries_stderr_and_updates_the_rest(
    registry: SourceRegistry, tmp_path: Path
) -> None:
    lost = make_repo(tmp_path / "lost", {"a.txt": "a\n"})
    kept = make_repo(tmp_path / "kept", {"a.txt": "a\n"})
    registry.add("lost", lost, kind="git")
    registry.add("kept", kept, kind="git")
    shutil.rmtree(lost)
    head = commit(kept, {"b.txt": "b\n"}, "b")

    with pytest.raises(SourceUpdateError) as info:
        registry.update()

    failure = info.value.failures["lost"]
    assert isinstance(failure, GitError)
    assert "does not appear to be a git repository" in failure.stderr
    assert [s.name for s in info.value.updated] == ["kept"]
    assert registry.get("kept").commit == head
    assert "lost: `git" in str(info.value)


def test_removing_a_git_source_deletes_its_clone(registry: SourceRegistry, tmp_path: Path) -> None:
    upstream = make_repo(tmp_path / "upstream", {"a.txt": "a\n"})
    source = registry.add("repo", upstream, kind="git")
    assert source.path.is_dir()

    registry.remove("repo")

    assert not source.path.exists()
    assert (upstream / "a.txt").exists()


def test_a_malformed_sources_file_names_itself(registry: SourceRegistry) -> None:
    registry.path.write_text("[sources.notes]\nkind = 'tape'\npath = '/x'\nadded_at = 1\n")
    with pytest.raises(SourceError, match=r"sources\.toml: \[sources\.notes\]: kind must be"):
        registry.list()
    registry.path.write_text("not toml [")
    with pytest.raises(SourceError, match="not valid TOML"):
        registry.list()


def test_concurrent_adds_all_land(registry: SourceRegistry, notes: Path) -> None:
    errors: list[BaseException] = []

    def add(index: int) -> None:
        try:
            SourceRegistry().add(f"n{index}", notes)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert sorted(s.name for s in registry.list()) == sorted(f"n{i}" for i in range(12))


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("https://github.com/o/r.git", True),
        ("ssh://git@host/o/r", True),
        ("git@github.com:o/r.git", True),
        ("file:///srv/repo", True),
        ("/srv/repo", False),
        ("./repo.git", False),
        ("notes", False),
    ],
)
def test_git_url_detection(location: str, expected: bool) -> None:
    assert is_git_url(location) is expected
