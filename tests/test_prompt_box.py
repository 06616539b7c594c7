"""PromptBox: a submit carries the text the field showed, not the kernel's lagging copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spawnkit.notebook.hub import Hub
from spawnkit.notebook.prompt_box import PromptBox
from spawnkit.notebook.widgets import ButlerDashboard
from spawnkit.store import SessionStore

REPO = Path(__file__).resolve().parent.parent


def from_browser(box: PromptBox, content: Any) -> None:
    """A custom message as the browser's widget sends it (ipywidgets' entry point)."""
    box._handle_custom_msg(content, [])


def test_a_submit_carries_the_fields_text() -> None:
    box = PromptBox(label="Trigger")
    got: list[str] = []
    box.on_submit(got.append)
    box.value = "I wei"  # the last sync that reached the kernel: typing went on
    from_browser(box, {"event": "submit", "text": "I weighed 72.4 kg"})
    assert got == ["I weighed 72.4 kg"]
    box.submit()  # from code: the current value
    assert got == ["I weighed 72.4 kg", "I wei"]


def test_what_is_not_a_submit_is_ignored_and_a_disabled_box_submits_nothing() -> None:
    box = PromptBox()
    got: list[str] = []
    box.on_submit(got.append)
    odd: list[Any] = [{"event": "click"}, {"event": "submit"}, {"event": "submit", "text": 3}, []]
    for content in odd:
        from_browser(box, content)
    box.disabled = True
    from_browser(box, {"event": "submit", "text": "later"})
    assert got == []
    box.disabled = False
    from_browser(box, {"event": "submit", "text": "now"})
    assert got == ["now"]


def test_a_chat_entry_is_emptied_only_once_its_text_was_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    box = PromptBox(multiline=False, clear_on_submit=True)
    to_browser: list[Any] = []
    monkeypatch.setattr(box, "send", lambda content, buffers=None: to_browser.append(content))
    got: list[str] = []
    box.on_submit(got.append)
    from_browser(box, {"event": "submit", "text": "what is on my todo?"})
    assert got == ["what is on my todo?"]
    assert to_browser == [{"event": "accepted", "text": "what is on my todo?"}]
    box.disabled = True  # a turn under way: a submit sent before the browser heard of it
    from_browser(box, {"event": "submit", "text": "and the meeting?"})
    assert got == ["what is on my todo?"] and len(to_browser) == 1, "refused: the text stays"


def test_a_failing_callback_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Outside IPython (as here, unless another test of this worker started a shell) the
    # error is logged; in IPython it is shown as a traceback.
    monkeypatch.setattr("ipywidgets.widgets.widget.get_ipython", lambda: None)
    box = PromptBox()
    got: list[str] = []

    def broken(text: str) -> None:
        raise ValueError(text)

    box.on_submit(broken)
    box.on_submit(got.append)
    from_browser(box, {"event": "submit", "text": "x"})
    assert got == ["x"] and "Exception in callback" in caplog.text
    box.on_submit(broken, remove=True)
    caplog.clear()
    box.submit("y")
    assert got == ["x", "y"] and not caplog.text


@pytest.mark.e2e
def test_the_dashboard_runs_the_text_its_trigger_was_clicked_with(store: SessionStore) -> None:
    hub = Hub(store)
    dashboard = ButlerDashboard(REPO / "roster", hub=hub, refresh_s=3600)
    try:
        dashboard.butler_choice.value = "health"
        assert dashboard.scenario_choice.value.startswith("replay: ")  # offline
        dashboard.prompt.value = "I wei"
        from_browser(dashboard.prompt, {"event": "submit", "text": "I weighed 72.4 kg"})
        [row] = dashboard._rows
        result = row.handle.job.future.result(timeout=120)
        from_browser(dashboard.prompt, {"event": "submit", "text": "  "})
        assert "type a prompt first" in dashboard.message.value
        assert len(dashboard._rows) == 1
    finally:
        dashboard.close()
        hub.close()
    assert result.success, result.error
    [record] = store.list_sessions()
    assert record.prompt == "I weighed 72.4 kg" and record.id == result.session_id
