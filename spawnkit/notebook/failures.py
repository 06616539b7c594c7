"""A failed or stopped run in a cell: one line, not a traceback into spawnkit.

The run view (or the terminal lines) already says what happened and what to
do, once. The cell must still fail, so that "Run All" and notebook runners
stop, so ``%%spawn`` raises; these exceptions tell IPython to print them as one
line (``_render_traceback_``, IPython's hook for exceptions that know how to
show themselves) that points to ``%spawn_debug`` for the full story: the
Python traceback, the error, the session's log folder and the CLI's stderr.
Both are :class:`~spawnkit.errors.SpawnError`, so ``except SpawnError`` and
``.result`` work as before.
"""

from __future__ import annotations

import traceback

from ..errors import SpawnError
from ..result import SpawnerResult
from ..store import SessionStore

_RED, _RESET = "\033[31m", "\033[0m"
STDERR_LINES = 30

_last: BaseException | None = None


class RunFailed(SpawnError):
    """The cell's run failed; the view above it shows the error and its remedy."""

    def headline(self) -> str:
        kind = f" ({self.result.error_kind})" if self.result.error_kind else ""
        return f"the run failed{kind}: its error is shown above"

    def _render_traceback_(self) -> list[str]:
        name = f"{_RED}{type(self).__name__}{_RESET}"
        return [f"{name}: {self.headline()} · %spawn_debug shows the details"]


class RunCancelled(RunFailed):
    """The cell's run was stopped (the kernel's stop button, Ctrl-C) and recorded as such."""

    def headline(self) -> str:
        session = self.result.session_id
        where = f" (session {session[:8]})" if session else ""
        return f"the run was stopped and recorded as cancelled{where}"


def remember(error: BaseException) -> None:
    """Keep the latest failure for ``%spawn_debug``."""
    global _last
    _last = error


def debug_report(store: SessionStore | None = None) -> str:
    """What ``%spawn_debug`` prints: the last failure in full."""
    error = _last
    if error is None:
        return "no spawnkit run has failed in this kernel"
    lines: list[str] = []
    result: SpawnerResult | None = getattr(error, "result", None)
    if result is not None:
        lines.append(
            f"session {result.session_id} · {result.status} · error_kind {result.error_kind}"
        )
        lines.append(f"error: {result.error}")
        record = store.get_session(result.session_id) if store and result.session_id else None
        if record is not None and record.log_dir is not None:
            lines.append(f"logs: {record.log_dir}")
            stderr = record.log_dir / "stderr.log"
            if stderr.is_file():
                tail = stderr.read_text(encoding="utf-8", errors="replace").splitlines()
                lines.append(f"stderr of the CLI (last {STDERR_LINES} lines):")
                lines.extend(f"  {line}" for line in tail[-STDERR_LINES:])
    lines.append("Python traceback:")
    lines.extend(line.rstrip("\n") for line in traceback.format_exception(error))
    return "\n".join(lines)
