"""How runs appear in IPython: once, live, then as a snapshot that survives saving.

A run started from a cell is shown by its live view (or its terminal lines);
its value, the :class:`~spawnkit.result.SpawnerResult` (or the background
:class:`~spawnkit.notebook.hub.RunHandle`, or an ``%%ask``'s
:class:`~spawnkit.ask.AskResult`), is still the cell's ``Out[n]`` for
code, but is not displayed a second time under it. IPython has no per-value
switch for that, so the first run installs a display formatter for these two
types (never at ``%load_ext``): a value shown live by the cell now executing is
skipped, every other display of it (``r`` in a later cell) shows the run's
static view, or in a terminal its text.
"""

from __future__ import annotations

import threading
from typing import Any

from ..ask import AskResult
from ..result import SpawnerResult
from .hub import RunHandle
from .static_view import static_html, static_text
from .view import RunView
from .view_state import ViewState

# id(value) -> (value, execution count of the cell that showed it live)
_shown: dict[int, tuple[object, int]] = {}
_lock = threading.Lock()
_installed: set[int] = set()


def _shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


def install(shell: Any) -> None:
    """Register the formatter on ``shell`` (once)."""
    if shell is None or id(shell) in _installed:
        return
    formatter = shell.display_formatter.ipython_display_formatter
    formatter.for_type(SpawnerResult, _display)
    formatter.for_type(RunHandle, _display)
    formatter.for_type(AskResult, _display_answer)
    _installed.add(id(shell))


def mark_shown(value: object) -> None:
    """``value`` was shown live by the cell now executing: its Out[n] stays silent."""
    shell = _shell()
    if shell is None:
        return
    install(shell)
    with _lock:
        # Only values of the current cell matter: forget the rest (bounded).
        count = shell.execution_count
        for key in [k for k, (_, n) in _shown.items() if n != count]:
            del _shown[key]
        _shown[id(value)] = (value, count)


def _was_shown(value: object) -> bool:
    shell = _shell()
    with _lock:
        entry = _shown.get(id(value))
        return (
            entry is not None
            and entry[0] is value
            and shell is not None
            and entry[1] == shell.execution_count
        )


def _in_kernel(shell: Any) -> bool:
    return type(shell).__name__ == "ZMQInteractiveShell"


def _display(value: SpawnerResult | RunHandle) -> None:
    from IPython.display import display

    shell = _shell()
    kernel = _in_kernel(shell)
    if _was_shown(value):
        if not kernel:
            print(str(value) if isinstance(value, SpawnerResult) else repr(value))
        return
    if isinstance(value, RunHandle):
        if kernel and isinstance(value.view, RunView):
            _show_again(value.view)
        else:
            print(repr(value))
        return
    state = ViewState.from_result(value)
    if kernel:
        bundle = {
            "text/html": static_html(state),
            "text/markdown": value._repr_markdown_(),
            "text/plain": static_text(state),
        }
        display(bundle, raw=True)  # type: ignore[no-untyped-call]
    else:
        print(static_text(state))


def _display_answer(value: AskResult) -> None:
    """An ask's answer: silent under the ``%%ask`` cell whose view showed it, else its
    Markdown (in a terminal, its text)."""
    from IPython.display import display

    if _was_shown(value):
        return
    if _in_kernel(_shell()):
        bundle = {"text/markdown": value.answer, "text/plain": value.answer}
        display(bundle, raw=True)  # type: ignore[no-untyped-call]
    else:
        print(value.answer)


def _show_again(view: RunView) -> None:
    """Display a run's view once more; a live one turns static when the run ends, as the
    first display does, so a saved notebook holds no widget view to miss."""
    from IPython.display import display

    board = display(view, display_id=True)  # type: ignore[no-untyped-call]
    if board is not None:
        view.on_finish.append(lambda finished: board.update(finished))
        if view.finished:  # it may have ended while the callback was being added
            board.update(view)
