"""Butlers in Jupyter AI's chat, in a real JupyterLab and headless Chromium.

JupyterLab with Jupyter AI's chat, persona and ACP parts (the ``jupyter-ai`` extra) finds
the roster's default butler through spawnkit's entry point and every other butler through
a two-line ``.jupyter/personas`` file. @-mentioning one runs ``spawnkit acp`` for it, on
the real Claude Code CLI and the replay model: its tool calls render in the chat, Stop
cancels the run, and every run is in the store. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spawnkit.store import SessionStore

from .conftest import REPO, processes_with_env, workspaces_of
from .test_browser import (
    ARTIFACTS,
    CHROMIUM,
    browser,  # noqa: F401 - a fixture
    free_port,
    jupyter_env,
    start_lab,
    stop,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]

PERSONAS_FILE = (
    "from spawnkit.notebook.jupyter_ai import butler_personas\n"
    "globals().update(butler_personas(__name__))\n"
)
# Before the demo's scripts: a prompt saying "slow" reads the log, then waits two minutes.
SLOW_SCRIPT = """
[[script]]
match = "(?i)\\\\bslow\\\\b"

  [[script.turn]]
  text = "Reading the log first."
  tool = "mcp__*__state_get"
  input = { key = "measurements/weight" }

  [[script.turn]]
  delay_ms = 120000
  text = "too late"

"""
PLACEHOLDER = "Type a chat message, @ to mention..."


def chat_scenario(roster: Path) -> None:
    demo = (roster / "health" / "scenarios" / "demo.toml").read_text()
    first = demo.index("[[script]]")
    text = demo[:first] + SLOW_SCRIPT + demo[first:]
    (roster / "health" / "scenarios" / "chat.toml").write_text(text)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[int]:
    import shutil

    work = tmp_path / "work"
    work.mkdir()
    roster = work / "roster"
    shutil.copytree(REPO / "roster", roster)
    chat_scenario(roster)
    personas = work / ".jupyter" / "personas"
    personas.mkdir(parents=True)
    (personas / "spawnkit_personas.py").write_text(PERSONAS_FILE)
    for name in ("weigh.chat", "slow.chat"):
        (work / name).write_text("{}")
    env = jupyter_env(tmp_path / "jupyter", jupyter_ai=True)
    env.update(SPAWNKIT_ROSTER=str(roster), SPAWNKIT_PERSONA_REPLAY="chat")
    port = free_port()
    proc = start_lab(work, env, port)
    try:
        yield port
    finally:
        stop(proc)


def open_chat(chromium: Any, port: int, name: str) -> tuple[Any, Any]:
    page = chromium.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(f"http://127.0.0.1:{port}/lab/tree/{name}?reset")
    box = page.get_by_placeholder(PLACEHOLDER)
    box.wait_for(timeout=240_000)
    return page, box


def choose_persona(page: Any, name: str) -> set[str]:
    """Pick the persona the chat's messages go to; the names it offered."""
    page.get_by_title("Choose which persona to message").click()
    menu = page.get_by_role("menuitem")
    menu.first.wait_for(timeout=30_000)
    offered = {text.strip() for text in menu.all_inner_texts()}
    menu.filter(has_text=name).first.click()
    return offered


def send(box: Any, text: str) -> None:
    box.fill(text)
    box.press("Enter")


def records() -> list[Any]:
    return SessionStore().list_sessions(limit=20)


def wait_records(predicate: Any, timeout_s: float = 120) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = records()
        if predicate(found):
            return found
        time.sleep(0.5)
    raise AssertionError(f"the store never showed it: {[(r.status, r.prompt) for r in records()]}")


def test_a_butler_answers_in_the_chat_with_its_tool_calls(
    lab: int,
    browser: Any,  # noqa: F811 - the fixture imported above
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page, box = open_chat(browser, lab, "weigh.chat")
    # Both routes give personas: `general` by the entry point, `health` by the file.
    assert {"general", "health"} <= choose_persona(page, "health")
    send(box, "@health I weighed 72.4 kg")
    try:
        page.get_by_text("Recorded 72.4 kg in your weight log.").wait_for(timeout=240_000)
    finally:
        page.screenshot(path=str(ARTIFACTS / "jupyter-ai-chat.png"))
    shown = page.locator(".jp-chat-messages-container").inner_text()
    for call in ("health.state_get", "health.state_set", "date +%F", "trend.py"):
        assert call in shown, shown
    assert "readings: 3" in shown  # the skill's real output, through the answer
    page.screenshot(path=str(ARTIFACTS / "jupyter-ai-chat.png"))
    (record,) = wait_records(lambda found: found and found[0].status != "running")
    assert record.status == "success" and record.butler == "health"
    assert record.prompt == "I weighed 72.4 kg"  # the mention routed it; it is no prompt
    assert [c.tool for c in record.tool_calls][:1] == ["state_get"]
    assert len(record.tool_calls) == 4
    page.close()


def test_stop_in_the_chat_cancels_the_run_and_leaves_nothing(
    lab: int,
    browser: Any,  # noqa: F811 - the fixture imported above
) -> None:
    page, box = open_chat(browser, lab, "slow.chat")
    choose_persona(page, "health")
    send(box, "@health do the slow one")
    page.get_by_text("health.state_get").first.wait_for(timeout=240_000)
    # The model's next turn takes two minutes: the run is still going.
    wait_records(lambda found: len(found) == 1 and found[0].status == "running")
    page.get_by_title("Stop generating").click()
    (record,) = wait_records(lambda found: found[0].status != "running")
    assert record.status == "cancelled", record.error
    assert processes_with_env("SPAWNKIT_BUTLER", "health") == []
    assert workspaces_of("health") == []
    page.close()
