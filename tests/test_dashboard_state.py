"""The dashboard's state, kernel side, over real runs of Claude Code against the replay server:
the prompt empties once a run was taken, only a live run has a Cancel button, each session
says where it came from and on which runtime, and the heading names the butlers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from pathlib import Path
from typing import Any

import pytest

import spawnkit
from spawnkit.notebook.hub import Hub
from spawnkit.notebook.prompt_box import PromptBox
from spawnkit.notebook.runner import spawn
from spawnkit.notebook.session_table import session_row, source_label
from spawnkit.notebook.widgets import ButlerDashboard, dashboard_title
from spawnkit.store import SessionStore

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SLOW = '[[turn]]\ndelay_ms = 60000\ntext = "late"\n'
QUICK = '[[turn]]\ntext = "Done: {{ prompt }}"\n'


def from_browser(box: PromptBox, content: Any) -> None:
    box._handle_custom_msg(content, [])


@pytest.fixture
def roster(make_butler: Any) -> Path:
    butler = make_butler()
    scenarios = butler.directory / "scenarios"
    scenarios.mkdir()
    (scenarios / "a_slow.toml").write_text(SLOW)
    (scenarios / "b_quick.toml").write_text(QUICK)
    return Path(butler.directory).parent


def test_trigger_clears_the_prompt_and_cancel_is_on_live_runs_only(
    roster: Path, store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = Hub(store)
    dashboard = ButlerDashboard(roster, hub=hub, refresh_s=3600)
    to_browser: list[Any] = []
    monkeypatch.setattr(
        dashboard.prompt, "send", lambda content, buffers=None: to_browser.append(content)
    )
    try:
        from_browser(dashboard.prompt, {"event": "submit", "text": "   "})
        assert to_browser == [], "refused: the text stays in the field"

        dashboard.scenario_choice.value = "replay: a_slow"
        from_browser(dashboard.prompt, {"event": "submit", "text": "wait for me "})
        assert to_browser == [{"event": "accepted", "text": "wait for me "}], "as sent"
        [slow] = dashboard._rows
        hub.loop.submit(dashboard.refresh()).future.result(timeout=60)
        assert slow.cancel in slow.header.children and not slow.cancel.disabled

        slow.cancel.click()
        done, _ = concurrent.futures.wait([slow.handle.job.future], timeout=120)
        assert done, "the cancelled run ended"
        dashboard.scenario_choice.value = "replay: b_quick"
        from_browser(dashboard.prompt, {"event": "submit", "text": "be quick"})
        quick = dashboard._rows[-1]
        result = quick.handle.job.future.result(timeout=120)
        hub.loop.submit(dashboard.refresh()).future.result(timeout=60)
        for row in (slow, quick):
            assert row.cancel not in row.header.children, "a finished run has no Cancel"
        assert result.success, result.error

        rows = {row["id"]: row for row in dashboard.sessions.rows}
        assert rows[result.session_id]["source"] == "dashboard"
        assert rows[result.session_id]["runtime"] == "claude-code"
        assert {r.trigger_source for r in store.list_sessions()} == {"dashboard"}
    finally:
        dashboard.close()
        hub.close()


def test_the_heading_names_the_butlers_not_a_path(roster: Path) -> None:
    from spawnkit.config.roster import load_roster

    loaded = load_roster(roster)
    title = dashboard_title(loaded)
    shown = title.split(">", 1)[1]
    assert "health" in shown and str(roster) not in shown
    assert str(roster) in title, "the roster's folder stays, as a tooltip"


def test_notebook_and_map_runs_say_where_they_came_from(roster: Path, store: SessionStore) -> None:
    hub = Hub(store)
    scenario = roster / "health" / "scenarios" / "b_quick.toml"
    try:
        one = spawn("hello", butler="health", roster=roster, replay=scenario, hub=hub,
                    render="text")  # fmt: skip
        frame = spawnkit.map(
            "health", ["a", "b"], roster=roster, replay=scenario, hub=hub, progress="none"
        )
    finally:
        hub.close()
    records = {r.id: r for r in store.list_sessions()}
    assert records[one.session_id or ""].trigger_source == "notebook"
    assert {records[s].trigger_source for s in frame["session_id"]} == {"map"}
    assert session_row(records[one.session_id or ""])["source"] == "notebook"


def test_source_labels() -> None:
    assert source_label("schedule:daily-weigh-in") == "schedule daily-weigh-in"
    assert source_label("trigger") == "trigger" and source_label("chat") == "chat"


def test_the_chat_widgets_turns_say_chat(tmp_path: Path, store: SessionStore) -> None:
    from spawnkit.containment.sources import SourceRegistry
    from spawnkit.notebook.asking import ChatWidget

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("water the fern\n")
    SourceRegistry().add("notes", notes)
    scenario = tmp_path / "chat.toml"
    scenario.write_text('[[turn]]\ntext = "First."\n[[turn]]\ntext = "Second."\n')
    hub = Hub(store)
    chat = ChatWidget("notes", runtime="claude-code", replay=scenario, hub=hub)
    try:
        for text in ("what is on my list?", "and then?"):
            job = chat.send(text)
            assert job is not None
            job.future.result(timeout=120)
    finally:
        chat.close()
        hub.close()
    records = store.list_sessions()
    assert len(records) == 2 and {r.trigger_source for r in records} == {"chat"}
    assert {session_row(r)["source"] for r in records} == {"chat"}


def test_a_refresh_refused_as_the_process_ends_stops_the_loop_quietly(
    roster: Path,
    store: SessionStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A terminal IPython that shows a dashboard and exits: the refresh's thread hop, the
    first of the process, raises as the interpreter shuts down. No traceback, no retry."""
    dashboard = ButlerDashboard(roster, hub=Hub(store), refresh_s=3600)
    try:

        async def ending() -> None:
            raise RuntimeError("can't register atexit after shutdown")  # threading's words

        monkeypatch.setattr(dashboard, "refresh", ending)
        with caplog.at_level(logging.ERROR):
            asyncio.run(asyncio.wait_for(dashboard._refresh_forever(), 30))
        assert [r for r in caplog.records if "refresh failed" in r.getMessage()] == []
    finally:
        dashboard.close()
