"""The live run view's diff cards in Debian's headless Chromium (Playwright), without a Lab.

``run_view.js`` renders a view state's snapshot through a stand-in of the widget model
(``get``, ``on``, ``off``, ``send``: all the file uses of it), on a page with the view's
stylesheet. The edits are a Claude Code ``Edit`` recorded in ``tests/data``, a ``Write``
of a new file and a Codex change reported by path only; the rows must show the diff
lines, counts and notes that the static transcript shows, open, with the input hidden.
The page's screenshot goes to ``test-artifacts/`` (``docs/screenshots/run-view-diff.png`` is one).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spawnkit.events import ToolCallFinished
from spawnkit.notebook.view_state import ViewState
from spawnkit.result import ToolCall

from .conftest import REPO
from .test_edits import NOW, POMODORO, claude_inputs

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NOTEBOOK = REPO / "spawnkit" / "notebook"
# Copied by hand to docs/screenshots/ when the view changes.
SCREENSHOT = REPO / "test-artifacts" / "run-view-diff.png"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]


@pytest.fixture
def page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield browser.new_page(viewport={"width": 900, "height": 700})
        finally:
            browser.close()


def finished(call_id: str, name: str, tool_input: dict[str, Any], output: str) -> ToolCallFinished:
    call = ToolCall.start(call_id, name, tool_input, NOW).finish(output, False, NOW)
    return ToolCallFinished("s", call)


def snapshot() -> dict[str, Any]:
    edit = next(claude_inputs(POMODORO, "Edit"))
    state = ViewState()
    state.apply(finished("e1", "Edit", edit, f"The file {edit['file_path']} has been updated."))
    write = {
        "file_path": "/work/trend.py",
        "content": "import pandas as pd\n\nprint(pd.__version__)\n",
    }
    state.apply(finished("w1", "Write", write, "File created successfully at: /work/trend.py"))
    change = {"changes": [{"path": "/work/data.parquet", "kind": "add"}]}
    state.apply(finished("f1", "file_change", change, "completed"))
    return state.snapshot()


def page_html(snap: dict[str, Any]) -> str:
    script = (NOTEBOOK / "run_view.js").read_text().replace("export default { render };", "")
    css = (NOTEBOOK / "run_view.css").read_text()
    model = (
        f"const snap = {json.dumps(snap)};"
        "const model = { get: () => snap, on() {}, off() {}, send() {} };"
        "render({ model, el: document.getElementById('view') });"
    )
    return (
        f"<html><head><style>{css}</style></head><body><div id='view'></div>"
        f"<script>{script}\n{model}</script></body></html>"
    )


def test_the_live_view_shows_each_edit_as_an_open_diff(page: Any) -> None:
    page.set_content(page_html(snapshot()))
    edit = page.locator("details.sk-tool").nth(0)
    assert edit.get_attribute("open") is not None, "an edit's row is open"
    assert edit.locator(".sk-summary").inner_text().endswith("styles.css +1 -0")
    assert edit.locator(".sk-diff-head").inner_text().endswith("styles.css +1 -0")
    added = edit.locator('.sk-dl[data-kind="add"]')
    assert added.inner_text() == "+    transition: color 0.6s ease, transform 0.4s ease;"
    assert edit.locator('.sk-dl[data-kind="ctx"]').count() == 4
    assert not edit.locator(".sk-input").is_visible(), "the input JSON is not shown"
    colour = added.evaluate("e => getComputedStyle(e).backgroundColor")
    assert colour == "rgba(46, 160, 67, 0.18)"
    write = page.locator("details.sk-tool").nth(1)
    assert write.locator(".sk-diff-note").inner_text() == "new file"
    assert write.locator('.sk-dl[data-kind="add"]').count() == 3
    codex = page.locator("details.sk-tool").nth(2)
    assert "Codex reports the path only" in codex.locator(".sk-diff-head").inner_text()
    assert codex.locator(".sk-dl").count() == 0
    page.locator(".sk-transcript").evaluate("e => { e.scrollTop = 0; }")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.locator("#view").screenshot(path=str(SCREENSHOT))


def test_a_saved_views_failures_only_box_works_without_a_script(page: Any) -> None:
    """The ended view is static HTML: its "failures only" is a checkbox and a stylesheet."""
    from spawnkit.notebook.static_view import static_html

    state = ViewState()
    calls = [("ok-1", False), ("bad-1", True), ("ok-2", False)]
    for call_id, failed in calls:
        call = ToolCall.start(call_id, "Bash", {"command": call_id}, NOW)
        state.apply(ToolCallFinished("s", call.finish("out", failed, NOW)))
    page.set_content(f"<html><body>{static_html(state)}</body></html>")
    rows = page.locator(".sk-static .sk-tool")
    assert [rows.nth(i).is_visible() for i in range(3)] == [True, True, True]
    page.locator(".sk-static label.sk-filter").click()
    assert page.locator(".sk-only-failed").is_checked()
    assert [rows.nth(i).is_visible() for i in range(3)] == [False, True, False]
    page.locator(".sk-static label.sk-filter").click()
    assert [rows.nth(i).is_visible() for i in range(3)] == [True, True, True]
    quiet = ViewState()
    quiet.apply(finished("ok", "Bash", {"command": "ls"}, "x"))
    assert 'class="sk-only-failed"' not in static_html(quiet), "no box without a failure"
