"""The sources registry: named directories, files and git clones that ask mode can read.

A user registers a source once (``spawnkit sources add notes ~/notes``) and names it in
later questions; :mod:`spawnkit.ask` links each requested source into the agent's
working directory. The registry is one TOML file, ``$SPAWNKIT_HOME/sources.toml``,
rewritten atomically under a lock; git sources are cloned into
``$SPAWNKIT_HOME/sources/git/<name>`` and brought up to date by :meth:`SourceRegistry.update`.
Git runs as a subprocess with a timeout, and its failures keep git's own stderr.

A source is read by runs, so it may neither hold ``$SPAWNKIT_HOME`` (``spawnkit sources
add home ~``) nor lie inside it: the store and the credentials are no run's to read, and a
read-only ``~`` would also cover every run's workspace. Such a path is refused when it is
added and again before a run (:func:`check_outside_state`), as Flatpak refuses to expose
its own state to an app; only git clones, which spawnkit itself keeps there, are allowed::

    SpawnkitError
    ├── ConfigError
    │   └── SourceError               a source cannot be registered, found or used
    │       ├── InvalidSourceNameError    the name is not [a-z0-9][a-z0-9_.-]* or is reserved
    │       ├── SourceExistsError         the name is taken
    │       ├── SourcePathError           the path does not exist (or no longer does), or holds
    │       │                             or lies in $SPAWNKIT_HOME
    │       └── UnknownSourceError        names every unknown name at once
    ├── GitError                      a git command failed or timed out; carries stderr
    └── SourceUpdateError             some sources could not be updated; carries each error
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

import tomli_w

from ..errors import ConfigError, SpawnkitError
from ..home import spawnkit_home

SourceKind = Literal["directory", "file", "git"]
KINDS: tuple[SourceKind, ...] = get_args(SourceKind)

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
MAX_NAME_LENGTH = 64
# Files ask mode writes next to the source links; a source may not shadow them.
RESERVED_NAMES = frozenset({"prompt.md", "opencode.json"})

REGISTRY_FILE = "sources.toml"
GIT_DIR = Path("sources") / "git"
GIT_TIMEOUT_S = 300.0
LOCK_TIMEOUT_S = 10.0
_GIT_KILL_GRACE_S = 2.0

# URLs git understands that are not local paths: scheme://... or scp-like user@host:path.
_GIT_URL_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:)", re.IGNORECASE)
_FIELDS = frozenset({"kind", "path", "url", "added_at", "updated_at", "branch", "commit", "pinned"})


class SourceError(ConfigError):
    """A source cannot be registered, found or used as given."""


class InvalidSourceNameError(SourceError, ValueError):
    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        super().__init__(f"invalid source name {name!r}: {reason}")


class SourceExistsError(SourceError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"a source named {name!r} already exists (remove it first)")


class SourcePathError(SourceError):
    def __init__(self, path: Path | str, message: str) -> None:
        self.path = Path(path)
        super().__init__(f"{path}: {message}")


class UnknownSourceError(SourceError):
    """Every requested name that is not registered, raised before anything runs."""

    def __init__(self, names: Sequence[str], known: Sequence[str]) -> None:
        self.names = tuple(names)
        self.known = tuple(known)
        listed = ", ".join(repr(name) for name in self.names)
        hint = f"registered: {', '.join(self.known)}" if self.known else "none are registered"
        noun = "source" if len(self.names) == 1 else "sources"
        super().__init__(
            f"unknown {noun} {listed} ({hint}; add one with `spawnkit sources add NAME PATH`)"
        )


class GitError(SpawnkitError):
    """A git command failed or timed out; ``stderr`` is what git said."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        what = "timed out" if returncode is None else f"failed with exit code {returncode}"
        detail = stderr.strip()
        super().__init__(f"`{' '.join(self.argv)}` {what}" + (f": {detail}" if detail else ""))


class SourceUpdateError(SpawnkitError):
    """Some sources could not be updated; the others were, and are in ``updated``."""

    def __init__(self, failures: Mapping[str, GitError], updated: Sequence[Source]) -> None:
        self.failures = dict(failures)
        self.updated = tuple(updated)
        lines = [f"{name}: {error}" for name, error in self.failures.items()]
        super().__init__("could not update " + "; ".join(lines))


@dataclass(frozen=True)
class Source:
    """One registered source.

    ``path`` is what ask mode links: the directory, the file, or the git clone.
    ``url`` is the clone's origin (git only). ``branch`` is the checked-out branch
    and ``commit`` its head; ``pinned`` says the user chose the branch, otherwise
    updates follow the remote's default branch.
    """

    name: str
    kind: SourceKind
    path: Path
    added_at: datetime
    url: str | None = None
    branch: str | None = None
    commit: str | None = None
    pinned: bool = False
    updated_at: datetime | None = None

    @property
    def location(self) -> str:
        """Where the source comes from: the git URL, else the path."""
        return self.url if self.url is not None else str(self.path)

    def to_toml(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "added_at": self.added_at}
        if self.kind == "git":
            data["url"] = self.url
            if self.branch:
                data["branch"] = self.branch
            if self.commit:
                data["commit"] = self.commit
            if self.pinned:
                data["pinned"] = True
        else:
            data["path"] = str(self.path)
        if self.updated_at is not None:
            data["updated_at"] = self.updated_at
        return data


def validate_name(name: str) -> str:
    """``name`` if it can name a source (it becomes a file name in the agent's directory)."""
    if not NAME_RE.fullmatch(name):
        raise InvalidSourceNameError(
            name, "use lowercase letters, digits, '_', '.' and '-', starting with a letter or digit"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidSourceNameError(name, f"at most {MAX_NAME_LENGTH} characters")
    if name in RESERVED_NAMES:
        raise InvalidSourceNameError(name, "the name is reserved for ask mode's own files")
    return name


def is_git_url(location: str) -> bool:
    """Whether ``location`` is a URL git clones from (not a local path)."""
    return bool(_GIT_URL_RE.match(location))


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _aware(value: Any, where: str) -> datetime:
    if not isinstance(value, datetime):
        raise SourceError(f"{where}: expected a date-time, got {value!r}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def run_git(
    args: Sequence[str], *, cwd: Path | None = None, timeout_s: float = GIT_TIMEOUT_S
) -> str:
    """Run ``git ARGS`` non-interactively; its stdout, or :class:`GitError` with its stderr.

    git runs in a session of its own so that a timeout also ends the helpers it
    started (ssh, remote helpers), and never prompts for credentials.
    """
    argv = ["git", *args]
    # No terminal prompt; without a controlling terminal ssh cannot ask either.
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise GitError(argv, 127, "git is not installed (or not on PATH)") from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        _, stderr = proc.communicate(timeout=_GIT_KILL_GRACE_S)
        raise GitError(argv, None, f"{stderr}\n(no answer within {timeout_s:g} s)") from exc
    if proc.returncode != 0:
        raise GitError(argv, proc.returncode, stderr)
    return stdout


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=_GIT_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=_GIT_KILL_GRACE_S)


class SourceRegistry:
    """The sources in ``<home>/sources.toml`` (``home`` defaults to ``$SPAWNKIT_HOME``).

    Every method reads the file afresh, so two processes (a notebook and a
    terminal) see each other's changes; writes hold a lock and replace the file
    atomically, so a reader never sees half of it.
    """

    def __init__(self, home: Path | None = None, *, git_timeout_s: float = GIT_TIMEOUT_S) -> None:
        self.home = home if home is not None else spawnkit_home()
        self.path = self.home / REGISTRY_FILE
        self.git_root = self.home / GIT_DIR
        self.git_timeout_s = git_timeout_s

    # -- reading -------------------------------------------------------------------

    def list(self) -> builtins.list[Source]:
        """Every source, sorted by name."""
        return sorted(self._load().values(), key=lambda source: source.name)

    def get(self, name: str) -> Source:
        return self.resolve([name])[0]

    def resolve(self, names: Iterable[str]) -> builtins.list[Source]:
        """The sources named, in order (duplicates dropped); every unknown name at once."""
        wanted = list(dict.fromkeys(names))
        sources = self._load()
        unknown = [name for name in wanted if name not in sources]
        if unknown:
            raise UnknownSourceError(unknown, sorted(sources))
        return [sources[name] for name in wanted]

    def clone_path(self, name: str) -> Path:
        return self.git_root / name

    # -- changing ------------------------------------------------------------------

    def add(
        self,
        name: str,
        location: str | os.PathLike[str],
        *,
        kind: SourceKind | None = None,
        branch: str | None = None,
    ) -> Source:
        """Register ``location`` as ``name``; a git source is cloned now.

        ``kind`` is inferred when omitted: a git URL (``https://``, ``ssh://``,
        ``file://``, ``user@host:path``) is a git source, an existing directory a
        directory source, an existing file a file source. Pass ``kind="git"`` to
        clone a local repository by its path. ``branch`` (git only) pins the
        branch; without it the remote's default branch is followed.
        """
        validate_name(name)
        raw = os.fspath(location)
        if kind is not None and kind not in KINDS:
            raise SourceError(f"unknown source kind {kind!r}; use one of {', '.join(KINDS)}")
        if kind is None:
            kind = "git" if is_git_url(raw) else self._path_kind(raw)
        if branch is not None and kind != "git":
            raise SourceError(f"a branch applies to git sources only, not to a {kind} source")
        self._check_free(name)
        if kind == "git":
            source = self._clone(name, raw, branch)
        else:
            path = Path(raw).expanduser().resolve()
            found = self._path_kind(raw)
            if found != kind:
                raise SourcePathError(path, f"is a {found}, not a {kind}")
            source = Source(name=name, kind=kind, path=path, added_at=_now())
            check_outside_state(source, self.home)
        try:
            with self._locked() as sources:
                if name in sources:
                    raise SourceExistsError(name)
                sources[name] = source
        except BaseException:
            if kind == "git":
                shutil.rmtree(source.path, ignore_errors=True)
            raise
        return source

    def remove(self, name: str) -> Source:
        """Unregister ``name``; a git source's clone is deleted, other sources are untouched."""
        with self._locked() as sources:
            if name not in sources:
                raise UnknownSourceError([name], sorted(sources))
            source = sources.pop(name)
        if source.kind == "git":
            shutil.rmtree(self.clone_path(name), ignore_errors=True)
        return source

    def update(self, name: str | None = None) -> builtins.list[Source]:
        """Bring git sources up to date (one, or all when ``name`` is None).

        A git source fetches its branch (the remote's current default branch
        unless pinned) and resets the clone to it; directory and file sources
        are read live and need nothing. Failures of some sources do not stop
        the others: :class:`SourceUpdateError` reports them after the rest.
        """
        targets = self.resolve([name]) if name is not None else self.list()
        updated: builtins.list[Source] = []
        failures: dict[str, GitError] = {}
        for source in targets:
            if source.kind != "git":
                updated.append(source)
                continue
            try:
                fresh = self._pull(source)
            except GitError as exc:
                failures[source.name] = exc
                continue
            with self._locked() as sources:
                if source.name in sources:  # removed meanwhile: do not resurrect it
                    sources[source.name] = fresh
            updated.append(fresh)
        if failures:
            raise SourceUpdateError(failures, updated)
        return updated

    # -- git -----------------------------------------------------------------------

    def _git(self, args: Sequence[str], cwd: Path | None = None) -> str:
        return run_git(args, cwd=cwd, timeout_s=self.git_timeout_s)

    def _clone(self, name: str, raw: str, branch: str | None) -> Source:
        url = raw if is_git_url(raw) else str(Path(raw).expanduser().resolve())
        if not is_git_url(raw) and not Path(url).exists():
            raise SourcePathError(url, "does not exist")
        dest = self.clone_path(name)
        self.git_root.mkdir(parents=True, exist_ok=True)
        # Clone beside the destination, then rename: a failed clone leaves nothing.
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.git_root))
        try:
            args = ["clone", "--quiet", "--no-recurse-submodules"]
            if branch:
                args += ["--branch", branch]
            self._git([*args, "--", url, str(staging / "clone")])
            shutil.rmtree(dest, ignore_errors=True)  # a stale clone of a removed source
            (staging / "clone").rename(dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        try:
            checked_out = self._git(["rev-parse", "--abbrev-ref", "HEAD"], dest).strip()
            commit = self._git(["rev-parse", "HEAD"], dest).strip()
        except GitError:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        return Source(
            name=name,
            kind="git",
            path=dest,
            added_at=_now(),
            url=url,
            branch=checked_out,
            commit=commit,
            pinned=branch is not None,
        )

    def _default_branch(self, clone: Path) -> str:
        out = self._git(["ls-remote", "--symref", "origin", "HEAD"], clone)
        for line in out.splitlines():
            ref, _, target = line.partition("\t")
            if target == "HEAD" and ref.startswith("ref: refs/heads/"):
                return ref.removeprefix("ref: refs/heads/")
        raise GitError(["git", "ls-remote", "--symref", "origin", "HEAD"], 0, out or "no HEAD")

    def _pull(self, source: Source) -> Source:
        clone = self.clone_path(source.name)
        if not (clone / ".git").exists():
            raise GitError(["git", "-C", str(clone)], 128, f"the clone {clone} is missing")
        branch = source.branch if source.pinned and source.branch else self._default_branch(clone)
        remote_ref = f"refs/remotes/origin/{branch}"
        self._git(["fetch", "--quiet", "--prune", "origin", f"+refs/heads/{branch}:{remote_ref}"],
                  clone)  # fmt: skip
        # The clone belongs to spawnkit: make it match the remote, whatever happened to it.
        self._git(["checkout", "--quiet", "--force", "-B", branch, remote_ref], clone)
        commit = self._git(["rev-parse", "HEAD"], clone).strip()
        return replace(source, branch=branch, commit=commit, updated_at=_now())

    # -- the file ------------------------------------------------------------------

    @staticmethod
    def _path_kind(raw: str) -> SourceKind:
        path = Path(raw).expanduser()
        if path.is_dir():
            return "directory"
        if path.is_file():
            return "file"
        if path.exists():
            raise SourcePathError(path, "is neither a directory nor a regular file")
        raise SourcePathError(path, "does not exist")

    def _check_free(self, name: str) -> None:
        if name in self._load():
            raise SourceExistsError(name)

    def _load(self) -> dict[str, Source]:
        try:
            with open(self.path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            return {}
        except tomllib.TOMLDecodeError as exc:
            raise SourceError(f"{self.path}: not valid TOML: {exc}") from exc
        table = data.get("sources", {})
        if not isinstance(table, dict):
            raise SourceError(f"{self.path}: [sources] must be a table")
        return {name: self._parse(name, entry) for name, entry in table.items()}

    def _parse(self, name: str, entry: Any) -> Source:
        where = f"{self.path}: [sources.{name}]"
        if not isinstance(entry, dict):
            raise SourceError(f"{where} must be a table")
        unknown = sorted(set(entry) - _FIELDS)
        if unknown:
            raise SourceError(f"{where}: unknown keys {', '.join(unknown)}")
        kind = entry.get("kind")
        if kind not in KINDS:
            raise SourceError(f"{where}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
        try:
            validate_name(name)
        except InvalidSourceNameError as exc:
            raise SourceError(f"{where}: {exc}") from exc
        strings = {key: entry.get(key) for key in ("path", "url", "branch", "commit")}
        for key, value in strings.items():
            if value is not None and not isinstance(value, str):
                raise SourceError(f"{where}: {key} must be a string")
        if kind == "git":
            if not strings["url"]:
                raise SourceError(f"{where}: a git source needs url")
            path = self.clone_path(name)
        else:
            if not strings["path"]:
                raise SourceError(f"{where}: a {kind} source needs path")
            path = Path(str(strings["path"]))
        updated = entry.get("updated_at")
        return Source(
            name=name,
            kind=kind,
            path=path,
            added_at=_aware(entry.get("added_at"), f"{where}: added_at"),
            url=strings["url"],
            branch=strings["branch"],
            commit=strings["commit"],
            pinned=bool(entry.get("pinned", False)),
            updated_at=None if updated is None else _aware(updated, f"{where}: updated_at"),
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Source]]:
        """Hold the registry's lock; the yielded dict is written back if the block succeeds."""
        self.home.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(REGISTRY_FILE + ".lock")
        with open(lock_path, "a") as lock:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise SourceError(
                            f"{self.path} is locked by another process "
                            f"(waited {LOCK_TIMEOUT_S:g} s)"
                        ) from None
                    time.sleep(0.05)
            try:
                sources = self._load()
                yield sources
                self._write(sources)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, sources: Mapping[str, Source]) -> None:
        document = {
            "sources": {name: sources[name].to_toml() for name in sorted(sources)},
        }
        text = (
            "# spawnkit sources: edit with `spawnkit sources add|remove|update`.\n"
            + tomli_w.dumps(document)
        )
        fd, tmp = tempfile.mkstemp(prefix=".sources-", suffix=".toml", dir=self.home)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            Path(tmp).replace(self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def check_outside_state(source: Source, home: Path) -> None:
    """Refuse ``source`` if its path holds the state folder ``home`` or lies inside it.

    A git source's clone, which spawnkit keeps under ``home``, is the one exception.
    """
    real, state = source.path.resolve(), home.resolve()
    if source.kind == "git" and real.parent == state / GIT_DIR:
        return
    if state.is_relative_to(real) or real.is_relative_to(state):
        where = "holds" if state.is_relative_to(real) else "lies inside"
        raise SourcePathError(
            source.path,
            f"source {source.name!r} {where} spawnkit's own state ({state}): no run may read it",
        )


def sources_list(sources: Iterable[Source | str]) -> str:
    """One ``- ./name/`` line per source (``- ./name`` for a file source)."""
    lines = []
    for source in sources:
        if isinstance(source, Source):
            suffix = "" if source.kind == "file" else "/"
            lines.append(f"- ./{source.name}{suffix}")
        else:
            lines.append(f"- ./{source}/")
    return "\n".join(lines)


__all__ = [
    "GitError",
    "InvalidSourceNameError",
    "Source",
    "SourceError",
    "SourceExistsError",
    "SourceKind",
    "SourcePathError",
    "SourceRegistry",
    "SourceUpdateError",
    "UnknownSourceError",
    "check_outside_state",
    "is_git_url",
    "run_git",
    "sources_list",
    "validate_name",
]
