"""The diff model (:mod:`spawnkit.edits`) on tool-call inputs the real CLIs recorded.

Claude Code's ``Edit``, ``MultiEdit`` and ``Write`` come from session files in
``tests/data/real/claude``, Gemini's ``replace`` and ``write_file`` from a Gemini chat,
Codex's ``apply_patch`` patch text and its ``FileChange`` changes (unified diffs) from
Codex session files; each is read where it was recorded, not copied here.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spawnkit.cli.console import EventPrinter, Style, render_diffs, render_session
from spawnkit.edits import FileDiff, diff_lines, file_diffs, patch_diffs, replacement
from spawnkit.events import ToolCallFinished
from spawnkit.notebook.static_view import static_html, static_text
from spawnkit.notebook.view_state import ViewState, approval_item, tool_item
from spawnkit.result import ToolCall, Usage
from spawnkit.store import SessionRecord

DATA = Path(__file__).parent / "data" / "real"
NOW = datetime(2026, 11, 28, tzinfo=UTC)
POMODORO = DATA / "claude/projects/yoavf-ai-sessions/claude-code-pomodoro-timer.jsonl"
VIEWER = (
    DATA / "claude/projects/d-kimuson-claude-code-viewer/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"
)
GEMINI = DATA / "gemini/tmp/ai-sessions/chats/session-2025-10-21T20-04-0b23371a.json"
CODEX = DATA / "codex/sessions"
CODEX_PATCHES = (
    CODEX / "2025/10/21" / "rollout-2025-10-21T20-02-50-019a085e-04c1-7f81-a09e-9555f6a1fb40.jsonl"
)
CODEX_CHANGES = (
    CODEX / "2025/09/19" / "rollout-2025-09-19T09-02-12-01996135-afde-7911-97f0-d863511eca56.jsonl"
)


def claude_inputs(path: Path, name: str) -> Iterator[dict[str, Any]]:
    for line in path.read_text().splitlines():
        message = json.loads(line).get("message")
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use" and block.get("name") == name:
                yield block["input"]


def gemini_inputs(name: str) -> list[dict[str, Any]]:
    messages = json.loads(GEMINI.read_text())["messages"]
    return [c["args"] for m in messages for c in m.get("toolCalls") or [] if c["name"] == name]


def codex_payloads(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text().splitlines():
        yield json.loads(line)["payload"]


def call(name: str, tool_input: dict[str, Any], output: str | None = None) -> ToolCall:
    started = ToolCall.start("c1", name, tool_input, NOW)
    return started if output is None else started.finish(output, False, NOW)


def test_a_claude_edit_is_a_diff_of_its_fragments() -> None:
    edit = next(claude_inputs(POMODORO, "Edit"))
    (diff,) = file_diffs(call("Edit", edit))
    assert diff.path == edit["file_path"] == "/Users/yoavfarhi/dev/pomodoro/claude/styles.css"
    assert (diff.added, diff.removed) == (1, 0)
    assert diff.lines == (
        "     margin-bottom: 20px;", "     text-transform: uppercase;", "     letter-spacing: 2px;",
        "+    transition: color 0.6s ease, transform 0.4s ease;", " }",
    )  # fmt: skip
    assert diff.header == f"{edit['file_path']} +1 -0"
    assert (diff.old_text, diff.new_text) == (edit["old_string"], edit["new_string"])


def test_every_recorded_claude_edit_counts_what_difflib_counts() -> None:
    edits = list(claude_inputs(POMODORO, "Edit"))
    assert len(edits) > 10
    for edit in edits:
        (diff,) = file_diffs(call("Edit", edit))
        old, new = edit["old_string"].splitlines(), edit["new_string"].splitlines()
        kept = len(old) - diff.removed
        assert kept == len(new) - diff.added >= 0
        assert all(line[:1] in " +-@" for line in diff.lines)


def test_a_multi_edit_is_one_diff_per_edit() -> None:
    multi = next(claude_inputs(VIEWER, "MultiEdit"))
    diffs = file_diffs(call("MultiEdit", multi))
    assert len(diffs) == len(multi["edits"]) and {d.path for d in diffs} == {multi["file_path"]}
    assert diffs[0].added == 11 and diffs[0].removed == 0
    assert "+export type {" in diffs[0].lines and "+// React-specific types" in diffs[0].lines


def test_a_write_is_all_additions_and_says_whether_the_file_was_new() -> None:
    write = next(claude_inputs(POMODORO, "Write"))
    lines = write["content"].splitlines()
    (before,) = file_diffs(call("Write", write))
    assert (before.added, before.removed, before.old_text) == (len(lines), 0, None)
    assert before.lines[0] == f"+{lines[0]}"
    assert before.note == "whole file written; its earlier content is not in the call"
    (created,) = file_diffs(
        call("Write", write, f"File created successfully at: {write['file_path']}")
    )
    assert created.note == "new file"


def test_gemini_replace_and_write_file() -> None:
    replace = gemini_inputs("replace")[0]
    (diff,) = file_diffs(call("replace", replace))
    assert diff.path == replace["file_path"] and (diff.added, diff.removed) == (1, 0)
    assert "+    transition: background-color 0.5s ease;" in diff.lines
    write = gemini_inputs("write_file")[1]
    (whole,) = file_diffs(call("write_file", write))
    assert whole.added == len(write["content"].splitlines()) and whole.removed == 0


def test_codex_apply_patch_text_is_read_per_file() -> None:
    patches = [p["input"] for p in codex_payloads(CODEX_PATCHES) if p.get("name") == "apply_patch"]
    (added,) = file_diffs(call("apply_patch", {"input": patches[0]}))
    assert (added.path, added.note, added.removed) == ("index.html", "new file", 0)
    assert added.lines[0] == "+<!DOCTYPE html>" and added.added == len(added.lines)
    updates = [d for p in patches for d in patch_diffs(p) if d.note is None]
    assert updates, "the session also updates files"
    for diff in updates:
        assert diff.added + diff.removed > 0 and diff.old_text is not None


def test_codex_file_changes_in_all_their_forms() -> None:
    ends = [p for p in codex_payloads(CODEX_CHANGES) if p.get("type") == "patch_apply_end"]
    diffs = file_diffs(call("file_change", {"changes": ends[0]["changes"]}))
    by_path = {d.path.rsplit("/", 1)[-1]: d for d in diffs}
    assert by_path["version.go"].lines == (
        "@@ -1,4 +1,4 @@", " package core", " ",
        '-const Version = "1.24.0"', '+const Version = "1.24"',
    )  # fmt: skip
    assert by_path["version.go"].header.endswith("version.go +1 -1")
    assert (by_path["RELEASE_NOTES.md"].added, by_path["RELEASE_NOTES.md"].note) == (3, "new file")
    # `codex exec --json` (seen from codex 0.169 on the replay model): paths and kinds only.
    exec_json = {
        "changes": [{"path": "/w/new.txt", "kind": "add"}, {"path": "/w/a.txt", "kind": "update"}]
    }
    new, updated = file_diffs(call("file_change", exec_json))
    assert (new.header, new.lines) == ("/w/new.txt", ())
    assert updated.note == "updated (Codex reports the path only, not the change)"
    # The app-server form: a diff per change, the kind as an object.
    app = {"changes": [{"path": "/w/a.txt", "kind": {"type": "update", "move_path": None},
                        "diff": "@@ -1 +1 @@\n-a\n+b\n"}]}  # fmt: skip
    (moved,) = file_diffs(call("file_change", app))
    assert (moved.added, moved.removed, moved.note) == (1, 1, None)


def test_a_patch_in_a_shell_command_and_tools_that_edit_nothing() -> None:
    command = "apply_patch <<'EOF'\n*** Begin Patch\n*** Delete File: old.txt\n*** End Patch\nEOF"
    (deleted,) = file_diffs(call("exec_command", {"cmd": command}))
    assert (deleted.path, deleted.note, deleted.lines) == ("old.txt", "file deleted", ())
    assert deleted.new_text is None, "no ACP diff for a deletion"
    assert file_diffs(call("Bash", {"command": "ls"})) == []
    assert file_diffs(call("Read", {"file_path": "/w/a"})) == []
    assert file_diffs(call("mcp__notes__Write", {"file_path": "/w/a", "content": "x"})) == []
    assert file_diffs(call("Edit", {"file_path": "/w/a", "old_string": 3})) == []


def test_a_notebook_edit() -> None:
    cell = {
        "notebook_path": "/w/a.ipynb",
        "cell_id": "c7",
        "new_source": "x = 1\ny = 2",
        "edit_mode": "insert",
    }
    (diff,) = file_diffs(call("NotebookEdit", cell))
    assert (diff.added, diff.note) == (2, "cell c7 inserted")


def test_long_diffs_are_cut_with_a_count_of_the_rest() -> None:
    big = "\n".join(f"line {i}" for i in range(100))
    (diff,) = file_diffs(call("Write", {"file_path": "/w/big.txt", "content": big}))
    text = list(diff_lines(diff, limit=10))
    assert text[0].startswith("/w/big.txt +100 -0") and text[1:11] == [
        f"+line {i}" for i in range(10)
    ]
    assert text[-1] == "… 90 more lines"
    sent = diff.to_dict(limit=10)
    assert (len(sent["lines"]), sent["more"]) == (10, 90)
    huge = replacement("/w/h", "a\n" * 6000, "b\n" * 6000)  # not compared: too long
    assert (huge.added, huge.removed) == (6000, 6000)


def edit_call() -> ToolCall:
    edit = {"file_path": "/w/notes.txt", "old_string": "a\nbeta\nc", "new_string": "a\nBETA\nc"}
    return call("Edit", edit, "The file /w/notes.txt has been updated successfully.")


def test_the_views_show_the_diff_instead_of_the_input() -> None:
    item = tool_item(edit_call())
    assert item["summary"] == "/w/notes.txt +1 -1"
    assert item["diffs"][0]["lines"] == [" a", "-beta", "+BETA", " c"]
    state = ViewState()
    state.apply(ToolCallFinished("s", edit_call()))
    page = static_html(state)
    assert '<details class="sk-item sk-tool" data-status="ok" open>' in page
    assert '<span class="sk-diff-path">/w/notes.txt</span> <span class="sk-add">+1</span>' in page
    assert '<div class="sk-dl" data-kind="del">-beta</div>' in page
    assert "old_string" not in page
    text = static_text(state)
    assert "      /w/notes.txt +1 -1\n       a\n      -beta\n      +BETA\n       c" in text


def test_a_live_snapshot_keeps_fewer_diff_lines_than_the_final_one() -> None:
    big = "\n".join(f"line {i}" for i in range(100))
    state = ViewState()
    state.apply(ToolCallFinished("s", call("Write", {"file_path": "/w/b", "content": big}, "ok")))
    (live,) = state.snapshot()["items"][0]["diffs"]
    (final,) = state.snapshot(final=True)["items"][0]["diffs"]
    assert (len(live["lines"]), live["more"]) == (20, 80)
    assert (len(final["lines"]), final["more"]) == (60, 40)


def test_an_approval_card_shows_the_edit_it_asks_for() -> None:
    card = approval_item(edit_call())
    assert card["input"] == "/w/notes.txt +1 -1\n a\n-beta\n+BETA\n c"
    assert approval_item(call("Bash", {"command": "ls"}))["input"] == '{\n  "command": "ls"\n}'


def test_the_terminal_colours_a_diff_only_on_a_terminal() -> None:
    assert render_diffs(edit_call()) == [
        "      /w/notes.txt +1 -1", "       a", "      -beta", "      +BETA", "       c",
    ]  # fmt: skip
    coloured = render_diffs(edit_call(), Style(enabled=True))
    assert coloured[2] == "      \033[31m-beta\033[39m"
    assert coloured[3] == "      \033[32m+BETA\033[39m"
    piped = io.StringIO()
    EventPrinter(piped)(ToolCallFinished("s", edit_call()))
    assert "      -beta\n      +BETA\n" in piped.getvalue() and "\033[" not in piped.getvalue()


def test_a_recorded_session_shows_its_edits() -> None:
    record = SessionRecord(
        id="s", butler="b", runtime="claude-code", model=None, prompt="p", context=None,
        trigger_source="notebook", status="success", success=True, error=None,
        error_kind=None, output="", tool_calls=[edit_call()], duration_ms=1, usage=Usage(),
        cost_usd=None, num_turns=1, trace_id=None, runtime_session_id=None,
        parent_session_id=None, created_at=NOW, started_at=NOW, completed_at=NOW,
    )  # fmt: skip
    text = render_session(record)
    assert "      /w/notes.txt +1 -1\n         a\n        -beta\n        +BETA" in text


@pytest.mark.parametrize("name", ["Edit", "Write", "file_change"])
def test_a_call_without_its_fields_is_no_diff(name: str) -> None:
    assert file_diffs(call(name, {})) == []
    assert isinstance(FileDiff("p", (), 0, 0).header, str)
