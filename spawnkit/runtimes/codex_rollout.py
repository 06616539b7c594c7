"""The file changes of a Codex run, with their lines, from the session file Codex writes.

``codex exec --json`` reports a file change by path and kind only (``{"path": ...,
"kind": "update"}``): what changed is not in it. Codex's own session file (its rollout,
``CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread id>.jsonl``) holds the same change
as an ``item_completed`` event whose ``FileChange`` item has, per path, a ``unified_diff``
(an update) or the ``content`` (a new file). Codex writes that event before it prints the
``item.completed`` line spawnkit reads, so the change is read from the file as the call
ends; when it is not there yet, once more after the CLI exited.

The rollout is read from where the last read stopped, whole lines only. A resumed session's
rollout already holds the changes of the runs before; they are counted when the thread
starts and skipped, so this run's n-th file change is the n-th after them (its paths are
checked against the call's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class RolloutChanges:
    """The ``FileChange`` items of one Codex session, in the order Codex wrote them."""

    def __init__(self, codex_home: Path) -> None:
        self.sessions = codex_home / "sessions"
        self.thread_id: str | None = None
        self.path: Path | None = None
        self.offset = 0
        self.changes: list[dict[str, Any]] = []
        self.skipped = 0  # changes of the session's earlier runs (a resume)

    def thread_started(self, thread_id: str) -> None:
        """Skip the changes the session's earlier runs made (a resumed session's file is
        there from the start; a new session's comes later)."""
        self.thread_id = thread_id
        self._read()
        self.skipped = len(self.changes)

    def change(self, index: int, paths: set[str]) -> dict[str, Any] | None:
        """This run's ``index``-th file change, if the rollout has it and it touches
        ``paths`` (the ``changes`` mapping of path -> change); else None."""
        position = self.skipped + index
        if position >= len(self.changes):
            self._read()
        if position >= len(self.changes):
            return None
        found = self.changes[position]
        return found if set(found) == paths else None

    def _read(self) -> None:
        if self.path is None and self.thread_id is not None:
            pattern = f"*/*/*/rollout-*-{self.thread_id}.jsonl"
            self.path = next(self.sessions.glob(pattern), None)
        if self.path is None:
            return
        try:
            with self.path.open("rb") as file:
                file.seek(self.offset)
                data = file.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        for line in data[:end].splitlines():
            changes = _file_change(line)
            if changes is not None:
                self.changes.append(changes)


def _file_change(line: bytes) -> dict[str, Any] | None:
    if b'"FileChange"' not in line:
        return None
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    payload = entry.get("payload") if isinstance(entry, Mapping) else None
    if not isinstance(payload, Mapping) or payload.get("type") != "item_completed":
        return None
    item = payload.get("item")
    if not isinstance(item, Mapping):
        return None
    changes = item.get("changes")
    if item.get("type") != "FileChange" or not isinstance(changes, Mapping):
        return None
    return {str(path): change for path, change in changes.items() if isinstance(change, Mapping)}
