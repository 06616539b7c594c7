"""End to end: each real CLI edits a file on the replay model, and every view shows the diff.

Claude Code (``Edit`` then ``Write``), Gemini (``replace`` then ``write_file``) and Codex
(``apply_patch`` through its shell, the way its models call it) change ``notes.txt`` and
create ``new.txt`` in the run's working folder. The run's own events go through the
notebook's view state and the terminal's printer (a pipe: plain ``+``/``-`` lines); the
static transcript (what nbconvert and nbviewer show) and the printed lines must hold the
file names, counts and changed lines. ``codex exec --json`` reports a file change by path
and kind only; its lines come from the session file Codex writes (its rollout).
"""

from __future__ import annotations

import io
import json
import tomllib
from pathlib import Path

import pytest

from spawnkit.cli.console import EventPrinter
from spawnkit.events import RunEvent
from spawnkit.notebook.hub import with_runtime
from spawnkit.notebook.static_view import static_html, static_text
from spawnkit.notebook.view_state import ViewState
from spawnkit.replay import Scenario
from spawnkit.serve.service import ButlerService

from .conftest import REPO

TOOLS = '[butler.runtime]\ntools = ["Bash", "Read", "Edit", "Write"]\n'
PATCH = (
    "*** Begin Patch\n*** Update File: notes.txt\n@@\n alpha\n-beta\n+BETA\n gamma\n"
    "*** Add File: new.txt\n+hello\n+world\n*** End Patch\n"
)


def script(runtime: str, work: Path) -> str:
    notes, new = json.dumps(str(work / "notes.txt")), json.dumps(str(work / "new.txt"))
    edit, write = {"claude-code": ("Edit", "Write"), "gemini": ("replace", "write_file")}.get(
        runtime, ("", "")
    )
    # Gemini's replace wants an instruction besides the texts.
    extra = ', instruction = "capitalise beta"' if runtime == "gemini" else ""
    if runtime == "codex":
        command = "apply_patch <<'EOF'\n" + PATCH + "EOF\n"
        turns = f"[[turn]]\nshell = {json.dumps(command)}\n"
    else:
        turns = (
            f'[[turn]]\ntool = "{edit}"\n'
            f'input = {{ file_path = {notes}, old_string = "beta", new_string = "BETA"{extra} }}\n'
            f'[[turn]]\ntool = "{write}"\n'
            f'input = {{ file_path = {new}, content = "hello\\nworld\\n" }}\n'
        )
    return turns + '[[turn]]\ntext = "Edited."\n'


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["claude-code", "gemini", "codex"])
async def test_an_edit_shows_as_a_diff_in_the_views_and_the_terminal(
    make_butler, store, tmp_path: Path, runtime: str
) -> None:
    if runtime != "claude-code" and not (REPO / "node_modules" / ".bin" / runtime).exists():
        pytest.skip("the node CLIs are not installed (npm ci)")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    scenario = Scenario.from_dict(tomllib.loads(script(runtime, work)), source="<edits>")
    events: list[RunEvent] = []
    piped = io.StringIO()
    printer = EventPrinter(piped)
    butler = with_runtime(make_butler(extra=TOOLS), runtime)

    def on_event(event: RunEvent) -> None:
        events.append(event)
        printer(event)

    async with ButlerService(butler, store=store, replay=scenario) as svc:
        result = await svc.trigger("edit the notes", workdir=work, on_event=on_event)

    assert result.success, result.error
    assert (work / "notes.txt").read_text() == "alpha\nBETA\ngamma\n"
    assert (work / "new.txt").read_text() == "hello\nworld\n"
    state = ViewState()
    for event in events:
        state.apply(event)
    page, text, printed = static_html(state), static_text(state), piped.getvalue()
    assert "\033[" not in printed, "a pipe gets no colours"
    notes, new = str(work / "notes.txt"), str(work / "new.txt")
    if runtime == "codex":  # exec --json names the files; their lines come from its rollout
        assert "Codex reports the path only" not in page + text + printed
    for shown in (text, printed):
        assert f"{notes} +1 -1" in shown
        assert "-beta" in shown and "+BETA" in shown
        assert f"{new} +2 -0" in shown and "+hello" in shown and "+world" in shown
    assert '<div class="sk-dl" data-kind="del">-beta</div>' in page
    assert '<div class="sk-dl" data-kind="add">+BETA</div>' in page
    assert '<span class="sk-add">+2</span> <span class="sk-del">-0</span>' in page
    assert '"old_string"' not in page, "an edit shows its diff, not its input as JSON"
    if runtime == "claude-code":
        assert "(new file)" in text, "Claude Code said it created the file"
