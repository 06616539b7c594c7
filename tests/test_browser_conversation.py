"""Stop, the ended view and the saved notebook in JupyterLab with its default settings, in a
real headless Chromium, on the real Claude Code CLI against the replay model: the Stop button
of a run a cell waits on (it interrupts the kernel) and of a background run (a widget
message); a finished run opened at its answer; the notebook saved, its kernel gone, reopened
with no "Error displaying widget" (JupyterLab saves no widget state by default).
Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from spawnkit.store import SessionStore

from .conftest import REPO, processes_with_env
from .test_browser import (
    ARTIFACTS,
    CHROMIUM,
    browser,  # noqa: F401 - a fixture
    cell_output,
    free_port,
    jupyter_env,
    open_notebook,
    run_all,
    shut_down_kernels,
    start_lab,
    stop,
    write_notebook,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]

# A plan longer than the view's box, then a tool call, then the answer at the very end.
PLAN = "\n".join(f"- step {i}: look at part {i}" for i in range(1, 61))
LONG = f"""
[[turn]]
text = '''{PLAN}'''
shell = "echo checked"
[[turn]]
text = "**The answer:** 42"
[[turn]]
text = "Going on with the plan: {{{{ prompt }}}}"
"""
SLOW = f"""
[[turn]]
text = '''{PLAN}'''
shell = "echo started"
[[turn]]
delay_ms = 120000
text = "too late"
"""
# The transcript box scrolled to its end: its start out of sight, the answer's end in it.
AT_ANSWER = """e => {
  const box = e.querySelector('.sk-transcript');
  const first = box.querySelector('.sk-item').getBoundingClientRect();
  const answer = [...box.querySelectorAll('.sk-text')].pop().getBoundingClientRect();
  const shown = box.getBoundingClientRect();
  return {overflows: box.scrollHeight > box.clientHeight + 20,
          startHidden: first.top < shown.top - 20,
          answerShown: answer.bottom <= shown.bottom + 1 && answer.bottom > shown.top};
}"""
# A live view following its run: scrolled to the newest row.
LIVE_AT_END = """e => {
  const box = e.querySelector('.sk-transcript');
  return {overflows: box.scrollHeight > box.clientHeight + 20,
          atEnd: box.scrollTop + box.clientHeight >= box.scrollHeight - 2};
}"""


@pytest.fixture
def lab_as_installed(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """JupyterLab with its default settings (no widget state saved), and the notebook."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "long.toml").write_text(LONG)
    (work / "slow.toml").write_text(SLOW)
    spawn = f"%%spawn --butler general --roster {REPO / 'roster'}"
    write_notebook(
        work / "stops.ipynb",
        ["%load_ext spawnkit",
         f"{spawn} --replay long.toml\nplan it",
         f"{spawn} --continue\nand then?",
         f"{spawn} --replay slow.toml --background --out bg\nwait in the background",
         "bg",  # the same live view once more, drawn whole at once
         f"{spawn} --replay slow.toml\nwait for me"],
    )  # fmt: skip
    env = jupyter_env(tmp_path / "jupyter")
    saved_state = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyter-widgets" / "jupyterlab-manager"
    (saved_state / "plugin.jupyterlab-settings").unlink()  # back to saveState: false
    port = free_port()
    proc = start_lab(work, env, port)
    try:
        yield port, work
    finally:
        stop(proc)


def stop_button(page: Any, cell: int) -> Any:
    button = cell_output(page, cell).locator(".spawnkit-run .sk-stop")
    button.wait_for(timeout=120_000)
    page.wait_for_function(
        "n => document.querySelectorAll('.jp-Notebook .jp-Cell')[n]"
        ".querySelector('.sk-tool[data-status=ok]')",
        arg=cell, timeout=120_000,
    )  # fmt: skip
    return button


def test_stop_buttons_the_answer_in_view_and_a_reopened_notebook(
    lab_as_installed: tuple[int, Path],
    browser: Any,  # noqa: F811 - the fixture imported above
) -> None:
    port, work = lab_as_installed
    ARTIFACTS.mkdir(exist_ok=True)
    page = open_notebook(browser, port, "stops.ipynb")
    run_all(page)

    # Views drawn before they are in the page (the second display of the background run,
    # all its rows at once) follow the run: they open at the newest row.
    stop_button(page, 5)
    for cell in (3, 4):
        live = cell_output(page, cell).locator(".spawnkit-run")
        live.locator(".sk-tool[data-status='ok']").wait_for(timeout=60_000)
        assert live.evaluate(LIVE_AT_END) == {"overflows": True, "atEnd": True}, cell
    cell_output(page, 5).scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "lab-stop-button.png"))

    # The run a cell waits on: its Stop interrupts the kernel, the cell says so in one line.
    # (Before the background run's: while a cell runs, the kernel reads no widget message.)
    stop_button(page, 5).click()
    stderr = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
    cell_output(page, 5).locator(stderr).wait_for(timeout=60_000)
    text = cell_output(page, 5).inner_text()
    assert text.count("RunCancelled: the run was stopped and recorded as cancelled") == 1, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text

    # A background run: the kernel is idle, its Stop sends the view's message; both of its
    # displays end as its static transcript.
    stop_button(page, 3).click()
    for cell in (3, 4):
        static = cell_output(page, cell).locator(".spawnkit-run.sk-static")
        static.locator(".sk-head[data-state='cancelled']").wait_for(timeout=60_000)

    # The finished run: its display is the static transcript, opened at the answer.
    ended = cell_output(page, 1).locator(".spawnkit-run.sk-static")
    assert ended.locator(".sk-text strong").last.inner_text() == "The answer:"
    assert ended.evaluate(AT_ANSWER) == {
        "overflows": True,
        "startHidden": True,
        "answerShown": True,
    }
    assert cell_output(page, 5).locator(".sk-head").get_attribute("data-state") == "cancelled"
    page.screenshot(path=str(ARTIFACTS / "lab-stopped-by-button.png"))

    # The continued run: the earlier turn collapsed above its own, open on a click.
    continued = cell_output(page, 2)
    earlier = continued.locator("details.sk-earlier")
    assert earlier.locator("> summary").inner_text() == "Earlier in this conversation · 1 run"
    assert not earlier.locator(".sk-earlier-prompt").is_visible()
    earlier.locator("> summary").click()
    assert earlier.locator(".sk-earlier-prompt").inner_text() == "you: plan it"
    assert earlier.locator(".sk-text strong").last.inner_text() == "The answer:"
    own = continued.locator(".spawnkit-run.sk-static").last
    # The replay's third turn: the agent had the first two in its conversation.
    assert own.locator(".sk-text").last.inner_text().startswith("Going on with the plan: ")
    earlier.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "lab-continued.png"))
    records = SessionStore().list_sessions()
    assert sorted(r.status for r in records) == ["cancelled", "cancelled", "success", "success"]
    for record in records:
        assert processes_with_env("SPAWNKIT_SESSION_ID", record.id) == [], "no CLI left behind"

    page.keyboard.press("Control+s")
    page.get_by_text("| Idle").first.wait_for()
    page.wait_for_timeout(1000)
    assert shut_down_kernels(page) == 1
    page.close()
    saved = nbformat.read(work / "stops.ipynb", as_version=4)
    widget = "application/vnd.jupyter.widget-view+json"
    assert [widget in o.data for c in saved.cells[1:] for o in c.outputs if "data" in o] == [
        False, False, False, False, False,
    ], "each ended run saved as its transcript, with no widget view to miss"  # fmt: skip

    page = open_notebook(browser, port, "stops.ipynb")
    runs = page.locator(".jp-OutputArea .spawnkit-run.sk-static")
    runs.nth(5).wait_for(timeout=60_000)
    assert runs.count() == 6, "five runs, and the earlier turn inside the continued one"
    notebook = page.locator(".jp-Notebook").inner_text()
    assert "Error displaying widget" not in notebook and "Loading widget" not in notebook
    assert runs.first.evaluate(AT_ANSWER) == {
        "overflows": True, "startHidden": True, "answerShown": True,
    }  # fmt: skip
    page.screenshot(path=str(ARTIFACTS / "lab-reopened-default-settings.png"))
    page.close()
