"""The credentials file: stored values for the variables butlers declare, kept out of the store.

``credentials.json`` sits beside the session store (by default in ``$SPAWNKIT_HOME``,
created with mode 0700) with mode 0600, so a damaged or copied ``sessions.db`` never
holds a secret, and the one file that does can be kept out of every run's sandbox.
Writers take an ``fcntl`` lock on ``.credentials.lock`` and replace the file atomically
(a fsynced temporary file renamed over it), so concurrent ``spawnkit credentials set``
calls from several processes never lose each other's values and readers, who take no
lock, always see a whole file. Older spawnkit versions kept credentials in the store's
``credentials`` table; :meth:`merge` is how :class:`~spawnkit.store.SessionStore` moves
them here (see there).

The file is JSON, ``{"format": 1, "credentials": {NAME: {"value": ..., "updated_at":
ISO-8601}}}``; a file that is not valid is reported, never overwritten. A file that other
users may read or write, or that another user owns, is refused with the ``chmod 600`` that
fixes it (:func:`check_private`), as ssh refuses such a private key and spawnkit refuses
such an MCP token file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shlex
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..errors import HomeNotWritable, SpawnkitError
from ..home import spawnkit_home

logger = logging.getLogger(__name__)

FILE_NAME = "credentials.json"
LOCK_NAME = ".credentials.lock"
FORMAT = 1
LOCK_TIMEOUT_S = 10.0
# Values are environment variables: no NUL byte, and a sane size (a PEM bundle fits).
MAX_VALUE_BYTES = 1024 * 1024
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CredentialError(SpawnkitError):
    """A credential cannot be stored or read: a bad name or value, or a bad file."""


def validate_name(name: str) -> str:
    """``name`` if it is an environment variable name, else a one-line CredentialError."""
    if not _NAME_RE.fullmatch(name):
        suggestion = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "MY_TOKEN"
        if suggestion[0].isdigit():
            suggestion = f"_{suggestion}"
        raise CredentialError(
            f"invalid credential name {name!r}: use an environment variable name "
            f"(letters, digits and _, not starting with a digit), e.g. {suggestion}"
        )
    return name


def validate_value(name: str, value: str) -> str:
    if not value:
        raise CredentialError(f"no value for {name}: the value is empty")
    if "\0" in value:
        raise CredentialError(f"the value of {name} contains a NUL byte, which no variable can")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise CredentialError(f"the value of {name} is not valid text (UTF-8)") from None
    if size > MAX_VALUE_BYTES:
        raise CredentialError(f"the value of {name} is longer than {MAX_VALUE_BYTES} bytes")
    return value


def check_private(path: Path, info: os.stat_result) -> None:
    """Refuse a credentials file another user owns, or that group or others may read,
    write or run: its values are then not the owner's secrets, or not only theirs."""
    if info.st_uid != os.geteuid():
        raise CredentialError(
            f"the credentials file {path} belongs to another user (uid {info.st_uid}), "
            f"so its values may not be yours: move it away, or `chown {os.geteuid()} "
            f"{shlex.quote(str(path))} && chmod 600 {shlex.quote(str(path))}` if they are"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise CredentialError(
            f"the credentials file {path} is open to other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}): run `chmod 600 {shlex.quote(str(path))}`"
        )


@dataclass(frozen=True)
class StoredCredential:
    name: str
    value: str
    updated_at: datetime


def _parse_time(raw: object) -> datetime:
    try:
        parsed = datetime.fromisoformat(str(raw))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


class CredentialFile:
    """The credentials file at ``path``: read without a lock, written under one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: tuple[tuple[int, int, int], dict[str, StoredCredential]] | None = None

    @classmethod
    def default(cls) -> CredentialFile:
        """The file in ``$SPAWNKIT_HOME`` (the home is created with mode 0700)."""
        return cls(spawnkit_home() / FILE_NAME)

    @classmethod
    def beside(cls, store_path: Path) -> CredentialFile:
        """The file that belongs to the session store at ``store_path``."""
        return cls.beside_dir(store_path.parent)

    @classmethod
    def beside_dir(cls, directory: Path) -> CredentialFile:
        """The file in ``directory``: a store's local folder (a server's store has one too)."""
        return cls(directory / FILE_NAME)

    # -- reading -------------------------------------------------------------------

    def load(self) -> dict[str, StoredCredential]:
        """Every stored credential by name; empty when there is no file yet.

        A file that other users could read or change, or that another user owns, is
        refused (see :func:`check_private`), as ssh refuses such a private key.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CredentialError(
                f"cannot read the credentials file {self.path}: {exc.strerror or exc}"
            ) from exc
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())  # the file read, whatever the path names by then
            check_private(self.path, info)
            key = (info.st_ino, info.st_mtime_ns, info.st_size)
            if self._cache is not None and self._cache[0] == key:
                return self._cache[1]
            raw = fh.read()
        try:
            document = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CredentialError(
                f"cannot read the credentials file {self.path}: {exc}; fix or move it away"
            ) from exc
        entries = document.get("credentials") if isinstance(document, dict) else None
        if not isinstance(entries, dict):
            raise CredentialError(
                f"the credentials file {self.path} has no 'credentials' table; fix or move it away"
            )
        credentials = {
            name: StoredCredential(name, entry["value"], _parse_time(entry.get("updated_at")))
            for name, entry in entries.items()
            if isinstance(entry, dict) and isinstance(entry.get("value"), str)
        }
        self._cache = (key, credentials)
        return credentials

    def get(self, name: str) -> str | None:
        entry = self.load().get(name)
        return entry.value if entry else None

    def names(self) -> list[str]:
        return sorted(self.load())

    # -- writing -------------------------------------------------------------------

    def set(self, name: str, value: str) -> None:
        validate_value(validate_name(name), value)
        with self._locked() as credentials:
            credentials[name] = StoredCredential(name, value, datetime.now(UTC))

    def delete(self, name: str) -> bool:
        with self._locked() as credentials:
            return credentials.pop(name, None) is not None

    def merge(self, incoming: Iterable[StoredCredential]) -> list[str]:
        """Add ``incoming``; where a name exists, the later ``updated_at`` wins.

        Returns the names whose incoming value lost to a newer one in the file. Running
        it twice with the same credentials changes nothing (the migration relies on it).
        """
        lost: list[str] = []
        with self._locked() as credentials:
            for entry in incoming:
                current = credentials.get(entry.name)
                if current is None or current.updated_at < entry.updated_at:
                    credentials[entry.name] = entry
                elif current.value != entry.value:
                    lost.append(entry.name)
        return lost

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, StoredCredential]]:
        """Hold the lock; the yielded dict is written back if the block succeeds."""
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise HomeNotWritable(folder, exc.strerror or str(exc)) from exc
        if folder.stat().st_mode & 0o077:
            logger.warning(
                "%s can be listed by other users; chmod 700 it (the credentials file "
                "itself is mode 600)",
                folder,
            )
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise CredentialError(
                            f"{self.path} is locked by another process "
                            f"(waited {LOCK_TIMEOUT_S:g} s)"
                        ) from None
                    time.sleep(0.02)
            self._cache = None
            credentials = dict(self.load())
            yield credentials
            self._write(credentials)
        finally:
            os.close(fd)  # closing releases the lock

    def _write(self, credentials: dict[str, StoredCredential]) -> None:
        document = {
            "format": FORMAT,
            "credentials": {
                name: {"value": entry.value, "updated_at": entry.updated_at.isoformat()}
                for name, entry in sorted(credentials.items())
            },
        }
        text = json.dumps(document, ensure_ascii=False, indent=1) + "\n"
        # mkstemp creates the file with mode 0600 whatever the umask.
        fd, tmp = tempfile.mkstemp(prefix=".credentials-", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            Path(tmp).replace(self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash
        finally:
            os.close(dir_fd)
        self._cache = None
