"""A run in terminal IPython: the transcript as lines, and a live status line under them.

Events arrive on spawnkit's background loop; :class:`TerminalView` turns each
into its line(s) (the same rendering as ``spawnkit run``: text blocks, then a
tool call's ``⚙`` line and its result line, in the order they happened) and
folds it into a :class:`~spawnkit.notebook.view_state.Status` for the header.
The cell's waiting thread calls :meth:`TerminalView.drain`, which prints the
new lines and, on a terminal, redraws one status line below them (what the run
waits on, the turn against the limit, tokens, cost, failed tool calls, time),
erased again when the run ends. Nothing is printed from the loop thread.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TextIO

from ..cli.console import Style, render_event, render_timing
from ..events import Finished, RunEvent, TextDelta, Timing
from .view_state import ViewState

REDRAW_S = 0.1
_ERASE = "\r\033[2K"


class TerminalView:
    """Collects lines on the loop thread; the waiting thread prints them."""

    def __init__(self, stream: TextIO | None = None, status_line: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.style = Style.for_stream(self.stream)
        self.status_line = self.stream.isatty() if status_line is None else status_line
        self.state = ViewState()
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._drawn = False
        self._last_draw = 0.0
        self._timing: Timing | None = None  # the last: one line before the summary

    def __call__(self, event: RunEvent) -> None:
        text = None if isinstance(event, TextDelta) else render_event(event, self.style)
        with self._lock:
            if isinstance(event, Finished) and self._timing is not None:
                self._lines.append(render_timing(self._timing, self.style))
            self._timing = event if isinstance(event, Timing) else self._timing
            self.state.apply(event)  # for the header (bounded; never rendered as HTML)
            if text is not None:
                self._lines.append(text)
            if isinstance(event, Finished) and self.state.status.hint:
                self._lines.append(self.style.red(self.state.status.hint))

    def drain(self, final: bool = False) -> None:
        """Print what arrived; redraw (or, when ``final``, erase) the status line."""
        with self._lock:
            lines, self._lines = self._lines, []
            status = self.state.status
            line = status.line() if status.live and not final else None
        now = time.monotonic()
        if not lines and (line is None or now - self._last_draw < REDRAW_S) and not final:
            return
        out = self.stream
        if self._drawn:
            out.write(_ERASE)
            self._drawn = False
        for text in lines:
            out.write(text + "\n")
        if self.status_line and line is not None:
            width = max(20, shutil.get_terminal_size().columns - 1)
            out.write(self.style.dim(line[:width]))
            self._drawn, self._last_draw = True, now
        out.flush()
