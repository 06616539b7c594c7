"""The file edits a tool call makes, as unified diffs: one reading of every runtime's edit tools.

A person reviewing an agent's work wants each edit as a diff (file, removed and added
lines, counts), not the tool's raw input. This module reads that from a
:class:`~spawnkit.result.ToolCall` of any runtime, with no I/O: Claude Code's ``Edit``,
``MultiEdit``, ``Write`` and ``NotebookEdit``; Gemini's ``replace`` and ``write_file``;
Codex's ``apply_patch`` (its patch text, as a tool or in a shell command) and its
``file_change`` items, whose changes carry a unified diff or content in its app-server
and session-file forms but only a path and a kind in ``codex exec --json`` (then the diff
says so). The run view, the static transcript, the terminal, the chat widget and the ACP
agent's ``diff`` content all read :func:`file_diffs`, so they agree.

An edit's text is a fragment of the file, not the file, so its diff has no line numbers
(``@@`` alone separates hunks); a ``Write`` whose earlier content the call does not carry
is all additions, with a note saying so unless the tool said it created the file.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .result import SHELL_TOOLS, ToolCall

# Lines a rendering shows of one file's diff before "N more lines".
SHOWN_LINES = 60
# A shown line keeps at most this many characters (minified code has very long ones).
LINE_CHARS = 400
# Context lines around each change of an edit's fragment.
CONTEXT_LINES = 3
# Fragments longer than this (in lines) are shown as removed then added, not compared:
# difflib's time grows faster than their length.
COMPARED_LINES = 5_000
_PATCH_START, _PATCH_END = "*** Begin Patch", "*** End Patch"
_WHOLE_FILE = "whole file written; its earlier content is not in the call"


@dataclass(frozen=True)
class FileDiff:
    """One file's change: unified diff lines (``@@``, `` ``, ``-``, ``+`` first), counts.

    ``old_text`` and ``new_text`` are the replaced and the new text as the call carries
    them (``old_text`` None for a new or wholly written file), for clients such as ACP's
    that draw diffs themselves.
    """

    path: str
    lines: tuple[str, ...]
    added: int
    removed: int
    note: str | None = None
    old_text: str | None = None
    new_text: str | None = None

    @property
    def header(self) -> str:
        """``path +A -R``; the path alone when the call does not carry the change."""
        if not self.lines:
            return self.path
        return f"{self.path} +{self.added} -{self.removed}"

    @property
    def unified(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)

    def shown(self, limit: int = SHOWN_LINES) -> tuple[tuple[str, ...], int]:
        """The first ``limit`` lines, and how many more there are."""
        return self.lines[:limit], max(0, len(self.lines) - limit)

    def to_dict(self, limit: int = SHOWN_LINES) -> dict[str, Any]:
        """What a view sends to the browser: header parts, the shown lines, what is left."""
        lines, more = self.shown(limit)
        return {
            "path": self.path,
            "header": self.header,
            "added": self.added,
            "removed": self.removed,
            "note": self.note,
            "lines": [_cut_line(line) for line in lines],
            "more": more,
        }


def _cut_line(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…"


def counted(
    path: str, lines: list[str], note: str | None, old: str | None, new: str | None
) -> FileDiff:
    """A diff of unified ``lines``, its additions and removals counted."""
    added = sum(1 for line in lines if line.startswith("+"))
    removed = sum(1 for line in lines if line.startswith("-"))
    return FileDiff(path, tuple(lines), added, removed, note, old, new)


def diff_from_lines(path: str, lines: list[str], note: str | None = None) -> FileDiff:
    """A diff of unified ``lines``, its old and new text rebuilt from them (no old text
    when every line is an addition: a new file; neither without lines: a deleted file)."""
    has_old = any(line[:1] in (" ", "-") for line in lines)
    new = _side(lines, "+") if lines else None
    return counted(path, lines, note, _side(lines, "-") if has_old else None, new)


def _side(lines: list[str], mark: str) -> str:
    return "".join(f"{line[1:]}\n" for line in lines if line[:1] in (" ", mark))


def replacement(path: str, old: str, new: str, note: str | None = None) -> FileDiff:
    """``old`` replaced by ``new`` in ``path``: a diff of the two fragments."""
    before, after = old.splitlines(), new.splitlines()
    if max(len(before), len(after)) > COMPARED_LINES:
        whole = [f"-{line}" for line in before] + [f"+{line}" for line in after]
        return counted(path, whole, note, old, new)
    lines: list[str] = []
    for line in difflib.unified_diff(before, after, lineterm="", n=CONTEXT_LINES):
        if line.startswith(("---", "+++")) and not lines:
            continue  # the two file header lines difflib starts with
        if line.startswith("@@"):
            if lines:  # a fragment has no line numbers: a bare marker between hunks
                lines.append("@@")
            continue
        lines.append(line)
    return counted(path, lines, note, old, new)


def whole_file(path: str, content: str, note: str | None = _WHOLE_FILE) -> FileDiff:
    """``content`` written to ``path``: every line an addition."""
    lines = [f"+{line}" for line in content.splitlines()]
    return FileDiff(path, tuple(lines), len(lines), 0, note, None, content)


def unified_diff(path: str, text: str, note: str | None = None) -> FileDiff:
    """A unified diff's text (``---``/``+++`` headers dropped) as a :class:`FileDiff`."""
    lines = [
        line for line in text.splitlines() if not line.startswith(("--- ", "+++ ", "diff --git"))
    ]
    return diff_from_lines(path, lines, note)


def patch_diffs(text: str) -> list[FileDiff]:
    """Codex's ``*** Begin Patch`` format: a diff per file it adds, updates or deletes."""
    diffs: list[FileDiff] = []
    path: str | None = None
    lines: list[str] = []
    note: str | None = None

    def close() -> None:
        if path is not None:
            diffs.append(diff_from_lines(path, lines, note))

    for raw in text.splitlines():
        if raw.startswith("*** ") and ": " in raw and not raw.startswith("*** Move to: "):
            close()
            action, _, path = raw[4:].partition(": ")
            lines, note = [], {"Add File": "new file", "Delete File": "file deleted"}.get(action)
        elif raw.startswith("*** Move to: "):
            note = f"moved to {raw.removeprefix('*** Move to: ')}"
        elif path is not None and (raw.startswith("@@") or raw[:1] in ("+", "-", " ")):
            lines.append(raw)
        elif path is not None and raw == "":
            lines.append(" ")  # an empty context line whose space was stripped
    close()
    return diffs


def _patch_in(text: str) -> str | None:
    start = text.find(_PATCH_START)
    end = text.find(_PATCH_END, start)
    return text[start : end + len(_PATCH_END)] if start >= 0 and end >= 0 else None


def _text(data: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = data.get(key)
        if isinstance(value, str):
            return value
    return None


def _edit(call: ToolCall) -> list[FileDiff]:
    data = call.input
    path, old = _text(data, "file_path", "path"), _text(data, "old_string")
    new = _text(data, "new_string")
    if path is None or old is None or new is None:
        return []
    note = "every occurrence replaced" if data.get("replace_all") is True else None
    return [replacement(path, old, new, note)]


def _multi_edit(call: ToolCall) -> list[FileDiff]:
    path, edits = _text(call.input, "file_path"), call.input.get("edits")
    if path is None or not isinstance(edits, list):
        return []
    return [
        replacement(path, edit["old_string"], edit["new_string"])
        for edit in edits
        if isinstance(edit, dict)
        and isinstance(edit.get("old_string"), str)
        and isinstance(edit.get("new_string"), str)
    ]


def _write(call: ToolCall) -> list[FileDiff]:
    path, content = _text(call.input, "file_path", "path"), _text(call.input, "content")
    if path is None or content is None:
        return []
    created = call.output is not None and "created" in call.output.lower()[:200]
    return [whole_file(path, content, "new file" if created else _WHOLE_FILE)]


def _notebook_edit(call: ToolCall) -> list[FileDiff]:
    data = call.input
    path = _text(data, "notebook_path")
    if path is None:
        return []
    mode = _text(data, "edit_mode") or "replace"
    cell = _text(data, "cell_id")
    where = f"cell {cell}" if cell else "a cell"
    if mode == "delete":
        return [FileDiff(path, (), 0, 0, f"{where} deleted")]
    source = _text(data, "new_source") or ""
    note = (
        f"{where} inserted"
        if mode == "insert"
        else f"{where} replaced (its old source is not in the call)"
    )
    return [whole_file(path, source, note)]


def _apply_patch(call: ToolCall) -> list[FileDiff]:
    text = _text(call.input, "input", "patch")
    return patch_diffs(text) if text is not None else []


def _shell_patch(call: ToolCall) -> list[FileDiff]:
    value = call.shell_command
    patch = _patch_in(value) if value is not None and "apply_patch" in value else None
    return patch_diffs(patch) if patch is not None else []


def _file_change(call: ToolCall) -> list[FileDiff]:
    changes = call.input.get("changes")
    if isinstance(changes, Mapping):  # session files: {path: {"type": ..., ...}}
        return [
            _change(str(path), change)
            for path, change in changes.items()
            if isinstance(change, Mapping)
        ]
    if isinstance(changes, list):  # exec --json and app-server: [{"path": ..., "kind": ...}]
        return [
            _change(str(change["path"]), change)
            for change in changes
            if isinstance(change, Mapping) and change.get("path")
        ]
    return []


_KIND_WORDS = {"add": "new file", "delete": "file deleted", "update": "updated"}


def _change(path: str, change: Mapping[str, Any]) -> FileDiff:
    kind = change.get("kind", change.get("type"))
    move = change.get("move_path")
    if isinstance(kind, Mapping):  # app-server: {"type": "update", "move_path": ...}
        move = kind.get("move_path", move)
        kind = kind.get("type")
    word = _KIND_WORDS.get(str(kind), str(kind or "changed"))
    if isinstance(move, str) and move:
        word += f", moved to {move}"
    diff = _text(change, "unified_diff", "diff")
    if diff:
        return unified_diff(path, diff, None if kind == "update" and not move else word)
    content = _text(change, "content")
    if content is not None and kind == "add":
        return whole_file(path, content, "new file")
    if kind == "delete":
        return FileDiff(path, (), 0, 0, "file deleted")
    return FileDiff(path, (), 0, 0, f"{word} (Codex reports the path only, not the change)")


_READERS: Mapping[str, Callable[[ToolCall], list[FileDiff]]] = {
    "Edit": _edit,
    "replace": _edit,
    "MultiEdit": _multi_edit,
    "Write": _write,
    "write_file": _write,
    "NotebookEdit": _notebook_edit,
    "apply_patch": _apply_patch,
    "file_change": _file_change,
    **{name: _shell_patch for name in SHELL_TOOLS},
}


def file_diffs(call: ToolCall) -> list[FileDiff]:
    """The file changes a tool call makes (empty for a call that edits no file)."""
    if call.server is not None:
        return []  # an MCP tool of the same name is not the CLI's edit tool
    reader = _READERS.get(call.name)
    return reader(call) if reader is not None else []


def diff_lines(diff: FileDiff, limit: int = SHOWN_LINES) -> Iterator[str]:
    """One diff as plain text lines: its header, its note, its lines, then what is left."""
    yield diff.header + (f"  ({diff.note})" if diff.note else "")
    lines, more = diff.shown(limit)
    yield from lines
    if more:
        yield f"… {more} more line{'s' if more != 1 else ''}"
