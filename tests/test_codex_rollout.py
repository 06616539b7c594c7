"""Codex file changes get their lines from Codex's own session file (its rollout).

``codex exec --json`` says only which files a change touched; the rollout's
``item_completed`` ``FileChange`` (the shape Codex 0.169 writes, seen in the e2e run of
tests/test_edits_e2e.py) holds each file's unified diff or new content.
"""

from __future__ import annotations

import json
from pathlib import Path

from spawnkit.edits import file_diffs
from spawnkit.events import ToolCallFinished
from spawnkit.runtimes.codex import CodexParser

THREAD = "01a21fd9-a790-7063-aa5e-3c48354192ec"


def rollout(home: Path) -> Path:
    folder = home / "sessions" / "2026" / "11" / "28"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"rollout-2026-11-28T01-51-27-{THREAD}.jsonl"


def change_line(diff: str) -> bytes:
    item = {
        "type": "FileChange", "id": "call_1", "status": "completed",
        "changes": {
            "/w/notes.txt": {"type": "update", "unified_diff": diff, "move_path": None},
            "/w/new.txt": {"type": "add", "content": "hello\nworld\n"},
        },
    }  # fmt: skip
    entry = {"type": "event_msg", "payload": {"type": "item_completed", "item": item}}
    return json.dumps(entry).encode() + b"\n"


def exec_item(kind: str, item_id: str = "item_3") -> str:
    changes = [{"path": "/w/new.txt", "kind": "add"}, {"path": "/w/notes.txt", "kind": "update"}]
    status = "completed" if kind == "item.completed" else "in_progress"
    item = {"id": item_id, "type": "file_change", "changes": changes, "status": status}
    return json.dumps({"type": kind, "item": item})


def run(parser: CodexParser, written: bytes) -> list:
    """The thread starts, Codex writes ``written`` to its rollout, then the change ends."""
    events = parser.feed(json.dumps({"type": "thread.started", "thread_id": THREAD}))
    with rollout(parser_home(parser)).open("ab") as file:
        file.write(written)
    events += parser.feed(exec_item("item.started"))
    return events + parser.feed(exec_item("item.completed"))


def parser_home(parser: CodexParser) -> Path:
    assert parser.rollout is not None
    return parser.rollout.sessions.parent


DIFF = "@@ -1,3 +1,3 @@\n alpha\n-beta\n+BETA\n gamma\n"


def finished(events: list) -> list:
    return [e.call for e in events if isinstance(e, ToolCallFinished)]


def test_a_file_change_ends_with_its_lines_from_the_rollout(tmp_path: Path) -> None:
    parser = CodexParser("s", "health", None, tmp_path)
    (call,) = finished(
        run(parser, b'{"type": "session_meta", "payload": {}}\n' + change_line(DIFF))
    )
    notes, new = sorted(file_diffs(call), key=lambda d: d.path, reverse=True)
    assert (notes.path, notes.added, notes.removed) == ("/w/notes.txt", 1, 1)
    assert "-beta" in notes.lines and "+BETA" in notes.lines
    assert (new.note, new.added) == ("new file", 2)


def test_a_change_the_rollout_lacked_comes_again_after_the_exit(tmp_path: Path) -> None:
    line = change_line(DIFF)
    parser = CodexParser("s", "health", None, tmp_path)
    (early,) = finished(run(parser, line[:40]))  # Codex is still writing the line
    assert all(not d.lines for d in file_diffs(early)), "paths only, for now"
    with rollout(tmp_path).open("ab") as file:
        file.write(line[40:])
    (late,) = finished(parser.ended())
    assert late.id == early.id and sum(d.added for d in file_diffs(late)) == 3
    assert parser.ended() == [], "once"


def test_a_resumed_sessions_earlier_changes_are_skipped(tmp_path: Path) -> None:
    path = rollout(tmp_path)
    path.write_bytes(change_line("@@ -1 +1 @@\n-old\n+older\n"))  # the run before
    parser = CodexParser("s", "health", None, tmp_path)
    parser.feed(json.dumps({"type": "thread.started", "thread_id": THREAD}))
    with path.open("ab") as file:
        file.write(change_line(DIFF))
    parser.feed(exec_item("item.started"))
    (call,) = finished(parser.feed(exec_item("item.completed")))
    notes = next(d for d in file_diffs(call) if d.path == "/w/notes.txt")
    assert "+BETA" in notes.lines and "+older" not in notes.lines


def test_a_change_of_other_files_is_not_taken(tmp_path: Path) -> None:
    other = change_line(DIFF).replace(b"/w/new.txt", b"/w/other.txt")
    (call,) = finished(run(CodexParser("s", "health", None, tmp_path), other))
    assert all(not d.lines for d in file_diffs(call))
