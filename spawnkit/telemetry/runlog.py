"""Per-session logs of what a runtime printed: ``$SPAWNKIT_HOME/sessions/<id>/``.

``stdout.log`` and ``stderr.log`` are written line by line as the runtime
produces them (so a hung or killed run still leaves its trace; the folder is made
by the first line, so a run that printed nothing has none), each up to a
size cap after which one marker line says how much was dropped. For Codex and
Gemini the stdout log holds the CLI's raw JSON lines; for Claude Code, which
spawnkit reads through the SDK, each JSON message the CLI sent, as the SDK read
it, one per line (the token deltas left out). Every line passes the run's
:class:`~spawnkit.redaction.Redactor` before it is written (and before the cap
is counted), so the injected secrets never reach the disk.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TextIO

from ..errors import InvalidSessionId
from ..home import home_path, spawnkit_home
from ..redaction import Redactor

DEFAULT_CAP_BYTES = 10 * 1024 * 1024
# A session id names a folder: one plain path component, never "..", "/" or a dot file.
SESSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_session_id(session_id: object) -> str:
    """``session_id`` if it is a plain name (letters, digits, ``._-``, at most 128)."""
    if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
        raise InvalidSessionId(
            f"invalid session id {session_id!r}: use letters, digits, '.', '_' and '-' "
            "(at most 128, starting with a letter or digit)"
        )
    return session_id


def session_log_dir(session_id: str) -> Path:
    return spawnkit_home() / "sessions" / check_session_id(session_id)


def session_log_path(session_id: str) -> Path:
    """Where :func:`session_log_dir` is, without making the home (a run's first log line
    does: :class:`RunLog`)."""
    return home_path() / "sessions" / check_session_id(session_id)


def _make_folder(folder: Path) -> None:
    """``folder`` and what is missing above it, private; the home first, as
    :func:`~spawnkit.home.spawnkit_home` makes it, when it is what is missing."""
    try:
        folder.mkdir(exist_ok=True, mode=0o700)
    except FileNotFoundError:
        if folder.parent.parent == home_path():
            spawnkit_home()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)


class _CappedFile:
    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self.cap = cap
        self.written = 0
        self.dropped = 0
        self._file: TextIO | None = None

    def write_line(self, line: str) -> None:
        data = line if line.endswith("\n") else line + "\n"
        size = len(data.encode("utf-8", errors="replace"))
        if self.written + size > self.cap:
            self.dropped += size
            return
        if self._file is None:
            # The session's folder is made by its first line: a run that prints nothing
            # (most of a no-op's) costs no mkdir.
            _make_folder(self.path.parent)
            # Held open for the whole run and closed by close(): lines arrive one by one.
            self._file = open(  # noqa: SIM115
                self.path, "a", encoding="utf-8", errors="replace", buffering=1
            )
        self._file.write(data)
        self.written += size

    def close(self) -> None:
        if self.dropped and self._file is not None:
            self._file.write(
                f"[spawnkit: log capped at {self.cap} bytes; {self.dropped} bytes dropped]\n"
            )
        if self._file is not None:
            self._file.close()
            self._file = None


class RunLog:
    """The stdout and stderr logs of one session."""

    def __init__(
        self,
        directory: Path,
        cap_bytes: int = DEFAULT_CAP_BYTES,
        redactor: Redactor | None = None,
    ) -> None:
        self.directory = directory  # made when a first line is written
        self.redactor = redactor or Redactor()
        self._stdout = _CappedFile(directory / "stdout.log", cap_bytes)
        self._stderr = _CappedFile(directory / "stderr.log", cap_bytes)

    @classmethod
    def for_session(
        cls, session_id: str, cap_bytes: int = DEFAULT_CAP_BYTES, redactor: Redactor | None = None
    ) -> RunLog:
        return cls(session_log_path(session_id), cap_bytes, redactor)

    def stdout(self, line: str) -> None:
        self._stdout.write_line(self.redactor.text(line))

    def stderr(self, line: str) -> None:
        self._stderr.write_line(self.redactor.text(line))

    def close(self) -> None:
        self._stdout.close()
        self._stderr.close()
