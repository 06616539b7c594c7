"""The approval card in JupyterLab, in a real headless Chromium: ``%%spawn`` on a butler with
``[butler.permissions] ask``, the real Claude Code CLI on the replay model, and a click on
Allow that lets the tool write its file. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spawnkit.store import SessionStore

from .test_approval_card import roster_with_asking_butler
from .test_browser import (
    ARTIFACTS,
    CHROMIUM,
    browser,  # noqa: F401 - a fixture
    free_port,
    jupyter_env,
    open_notebook,
    run_all,
    start_lab,
    stop,
    wait_state,
    write_notebook,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]


@pytest.fixture
def lab_with_asking_butler(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    work = tmp_path / "work"
    out = tmp_path / "out"
    work.mkdir()
    out.mkdir()
    roster = roster_with_asking_butler(work, out)
    scenario = roster / "health" / "scenarios" / "write.toml"
    write_notebook(
        work / "approve.ipynb",
        ["%load_ext spawnkit",
         f"%%spawn --background --butler health --roster {roster} --replay {scenario}\n"
         "write the note"],
    )  # fmt: skip
    write_notebook(
        work / "foreground.ipynb",
        ["%load_ext spawnkit",
         f"%%spawn --butler health --roster {roster} --replay {scenario}\nwrite the note"],
    )  # fmt: skip
    port = free_port()
    proc = start_lab(work, jupyter_env(tmp_path / "jupyter"), port)
    try:
        yield port, out
    finally:
        stop(proc)


def test_allow_on_the_card_lets_the_tool_run(
    lab_with_asking_butler: tuple[int, Path],
    browser: Any,  # noqa: F811 - the fixture imported above
) -> None:
    port, out = lab_with_asking_butler
    ARTIFACTS.mkdir(exist_ok=True)
    page = open_notebook(browser, port, "approve.ipynb")
    run_all(page)
    card = page.locator(".spawnkit-run .sk-approval[data-state='waiting']")
    card.wait_for(timeout=240_000)
    assert "Write asks to run" in card.inner_text()
    assert str(out / "note.txt") in card.locator(".sk-input").inner_text()
    assert (
        page.locator(".spawnkit-run .sk-waiting")
        .inner_text()
        .startswith("waiting for your approval of Write")
    )
    page.screenshot(path=str(ARTIFACTS / "lab-approval-card.png"))
    card.locator(".sk-allow").click()
    page.locator(".spawnkit-run .sk-approval[data-state='allowed']").wait_for(timeout=120_000)
    wait_state(page, "success")
    page.close()
    assert (out / "note.txt").read_text() == "from the card"
    (record,) = SessionStore().list_sessions()
    assert [(a.allowed, a.by) for a in record.permissions] == [(True, "notebook")]


def test_a_foreground_run_asks_in_the_cells_input_box(
    lab_with_asking_butler: tuple[int, Path],
    browser: Any,  # noqa: F811 - the fixture imported above
) -> None:
    port, out = lab_with_asking_butler
    ARTIFACTS.mkdir(exist_ok=True)
    page = open_notebook(browser, port, "foreground.ipynb")
    run_all(page)
    box = page.locator(".jp-Stdin-input")
    box.wait_for(timeout=240_000)
    card = page.locator(".spawnkit-run .sk-approval[data-state='waiting']")
    assert "answer in the box below the cell" in card.inner_text()
    assert not card.locator(".sk-allow").is_visible(), "no button the busy kernel cannot hear"
    page.screenshot(path=str(ARTIFACTS / "lab-approval-below.png"))
    box.fill("y")
    box.press("Enter")
    wait_state(page, "success")
    page.close()
    assert (out / "note.txt").read_text() == "from the card"
