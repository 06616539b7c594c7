"""The notebook's approval card: a ``[butler.permissions] ask`` question in the run view.

The view state is pure and tested alone; the round trip runs ``spawnkit.spawn`` as
``%%spawn`` does (a widget view, the hub's loop) with the real Claude Code CLI against the
replay server, and answers the card with the custom message its button sends.
"""

from __future__ import annotations

import json
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spawnkit.events import PermissionAsked, PermissionDecided, Started
from spawnkit.notebook.hub import Hub, RunHandle
from spawnkit.notebook.runner import spawn
from spawnkit.notebook.static_view import static_html, static_text
from spawnkit.notebook.view import RunView
from spawnkit.notebook.view_state import ViewState
from spawnkit.result import PermissionAnswer, SpawnerResult, ToolCall
from spawnkit.store import SessionStore

CALL = ToolCall.start("t-1", "Write", {"file_path": "/tmp/x", "content": "hi"}, datetime.now(UTC))


def answered(allowed: bool, by: str = "notebook", reason: str | None = None) -> PermissionAnswer:
    return PermissionAnswer("t-1", "Write", allowed, by, datetime.now(UTC), reason=reason)


def test_a_question_shows_as_a_waiting_card_until_it_is_answered() -> None:
    state = ViewState()
    state.apply(Started("s", "health", "claude-code", None, None))
    state.apply(PermissionAsked("s", CALL))
    batch = state.take_batch()
    assert batch is not None
    (card,) = batch["items"]
    assert (card["kind"], card["state"], card["call_id"]) == ("approval", "waiting", "t-1")
    assert card["input"].startswith("/tmp/x +1 -0") and card["input"].endswith("\n+hi"), "the diff"
    assert batch["header"]["waiting"] == "waiting for your approval of Write"
    state.apply(PermissionDecided("s", CALL, answered(False, reason="no\nway")))
    batch = state.take_batch()
    assert batch is not None
    (card,) = batch["items"]
    assert card["state"] == "denied" and card["text"] == "Write: denied (notebook): no way"
    assert batch["header"]["waiting"] != "waiting for your approval of Write"
    state.finish(SpawnerResult(session_id="s"))
    assert "? Write: denied (notebook): no way" in static_text(state)
    assert 'class="sk-item sk-approval" data-state="denied"' in static_html(state)


def from_browser(view: RunView, content: Any) -> None:
    """A custom message as the browser's widget sends it (ipywidgets' entry point)."""
    view._handle_custom_msg(content, [])


def roster_with_asking_butler(tmp_path: Path, out: Path) -> Path:
    roster = tmp_path / "roster"
    folder = roster / "health"
    (folder / "scenarios").mkdir(parents=True)
    (folder / "butler.toml").write_text(
        textwrap.dedent(f"""
        [butler]
        name = "health"
        port = 18190
        [butler.permissions]
        ask = ["Write"]
        [butler.sandbox]
        write = [{json.dumps(str(out))}]
        """)
    )
    (folder / "CLAUDE.md").write_text("Be brief.")
    (folder / "scenarios" / "write.toml").write_text(
        textwrap.dedent(f"""
        [[turn]]
        tool = "Write"
        input = {{ file_path = {json.dumps(str(out / "note.txt"))}, content = "from the card" }}
        [[turn]]
        text = "Write said: {{{{ last_tool_result }}}}"
        """)
    )
    return roster


def wait_for(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout  # a hang guard, not a timing assertion
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.e2e
@pytest.mark.parametrize("allowed", [True, False])
def test_the_card_answers_the_run_from_the_browser(
    tmp_path: Path, store: SessionStore, monkeypatch: pytest.MonkeyPatch, allowed: bool
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    roster = roster_with_asking_butler(tmp_path, out)
    hub = Hub(store)
    try:
        handle = spawn(
            "write the note", butler="health", roster=roster,
            replay=roster / "health" / "scenarios" / "write.toml",
            render="widget", background=True, hub=hub,
        )  # fmt: skip
        assert isinstance(handle, RunHandle) and isinstance(handle.view, RunView)
        view = handle.view
        sent: list[dict[str, Any]] = []
        monkeypatch.setattr(view, "send", lambda content, buffers=None: sent.append(content))

        def card(state: str) -> dict[str, Any] | None:
            for batch in list(sent):
                for item in batch.get("items", ()):
                    if item.get("kind") == "approval" and item["state"] == state:
                        return item  # type: ignore[no-any-return]
            return None

        wait_for(lambda: card("waiting") is not None)
        waiting = card("waiting")
        assert waiting is not None and waiting["label"] == "Write"
        from_browser(view, {"kind": "permission", "id": waiting["call_id"], "allowed": allowed})
        result = handle.job.future.result(timeout=120)
        wait_for(lambda: card("allowed" if allowed else "denied") is not None)
    finally:
        hub.close()
    assert result.success, result.error
    assert (out / "note.txt").exists() is allowed
    record = store.get_session(result.session_id or "")
    assert record is not None
    assert [(a.allowed, a.by) for a in record.permissions] == [(allowed, "notebook")]
    if not allowed:
        assert "the person at the notebook denied this tool call" in result.output


def test_an_answer_for_no_question_is_ignored() -> None:
    view = RunView()
    assert view.answer("nothing", True) is False
    from_browser(view, {"kind": "permission", "id": "nothing", "allowed": "yes"})  # no crash


@pytest.mark.e2e
def test_a_foreground_run_puts_the_question_in_the_cells_input_box(
    tmp_path: Path, store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell blocked in ``%%spawn`` reads no widget message: the question goes to input()."""
    out = tmp_path / "out"
    out.mkdir()
    roster = roster_with_asking_butler(tmp_path, out)
    prompts: list[str] = []

    def typed(prompt: str) -> str:
        prompts.append(prompt)
        return "y"

    monkeypatch.setattr("builtins.input", typed)
    monkeypatch.setattr("spawnkit.notebook.runner._show", lambda view: None)
    hub = Hub(store)
    try:
        result = spawn(
            "write the note", butler="health", roster=roster,
            replay=roster / "health" / "scenarios" / "write.toml", render="widget", hub=hub,
        )  # fmt: skip
    finally:
        hub.close()
    assert isinstance(result, SpawnerResult) and result.success, result
    assert prompts == [f"Allow Write ({out / 'note.txt'})? [y/N] "]
    assert (out / "note.txt").read_text() == "from the card"
    assert [(a.allowed, a.by) for a in result.permissions] == [(True, "notebook")]
