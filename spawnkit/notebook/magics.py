"""IPython magics: ``%%spawn`` and the ``%spawn_*`` line magics.

A thin frontend: arguments are parsed with ``magic_arguments`` (so ``%%spawn?``
shows help and bad arguments raise ``UsageError``), the cell body is the
prompt, verbatim unless ``--interpolate``, and the run happens on spawnkit's
background loop through the kernel's :class:`~spawnkit.notebook.hub.Hub`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display
from traitlets import Enum, Integer, Unicode

from ..console import render_event
from ..errors import ConfigError, SpawnError, SpawnkitError
from ..events import RunEvent
from ..result import SpawnerResult
from ..roster import adhoc_butler, load_roster
from ..runtimes import available_runtimes
from .hub import Hub, RunHandle, Target, with_runtime
from .kernel_tools import kernel_tools
from .view import RunView


def _in_kernel() -> bool:
    return "ipykernel" in sys.modules and type(_shell()).__name__ == "ZMQInteractiveShell"


def _shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


class _TextLines:
    """Collects rendered event lines on the loop thread; the cell's thread prints them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, event: RunEvent) -> None:
        text = render_event(event)
        if text is not None:
            self.lines.append(text)

    def drain(self) -> None:
        lines, self.lines = self.lines, []
        for line in lines:
            print(line, flush=True)


@magics_class
class SpawnMagics(Magics):
    """Spawn agent CLI runs from notebook cells."""

    default_runtime = Unicode(
        "claude-code", help="Runtime used when %%spawn names none (claude-code, codex, gemini)."
    ).tag(config=True)
    roster = Unicode("roster", help="Roster directory used to look up --butler names.").tag(
        config=True
    )
    max_turns = Integer(
        None, allow_none=True, help="Default max_turns for runs (None: the butler's own)."
    ).tag(config=True)
    render = Enum(
        ["auto", "widget", "text", "none"],
        "auto",
        help="Live rendering: widget (Jupyter), text (terminal), none, or auto.",
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._hub: Hub | None = None

    @property
    def ip(self) -> Any:
        """The shell these magics are registered with."""
        if self.shell is None:
            raise UsageError("spawnkit magics need an IPython shell")
        return self.shell

    @property
    def hub(self) -> Hub:
        if self._hub is None:
            self._hub = Hub()
        return self._hub

    def close(self) -> None:
        if self._hub is not None:
            self._hub.close()
            self._hub = None

    # -- %%spawn ---------------------------------------------------------------------

    @magic_arguments()
    @argument("runtime", nargs="?", default=None, help="claude-code, codex or gemini")
    @argument("--butler", help="a butler from the roster (default: the notebook butler)")
    @argument("--roster", help="roster directory (default: SpawnMagics.roster)")
    @argument("--max-turns", type=int, help="maximum agent turns")
    @argument("--model", help="model name for the runtime")
    @argument("--replay", help="play model turns from this scenario (offline)")
    @argument("--background", action="store_true", help="return a run handle at once")
    @argument("--out", help="also bind the result (or handle) to this variable")
    @argument("--context", help="a Python expression whose value is put before the prompt")
    @argument("--interpolate", action="store_true", help="expand {var} and $var in the prompt")
    @argument("--allow-failure", action="store_true", help="return a failed result, not raise")
    @argument("--kernel-tools", action="store_true", help="let the agent read kernel variables")
    @cell_magic
    def spawn(self, line: str, cell: str) -> SpawnerResult | RunHandle | None:
        """Run the cell as a prompt on an agent CLI; the value is the SpawnerResult."""
        args = parse_argstring(self.spawn, line)
        prompt = self.ip.var_expand(cell, depth=1) if args.interpolate else cell
        if not prompt.strip():
            raise UsageError("%%spawn needs a prompt in the cell body")
        target = self._target(args)
        context = self._context(args.context)
        max_turns = args.max_turns if args.max_turns is not None else self.max_turns
        if max_turns is not None and max_turns < 1:
            raise UsageError("--max-turns must be at least 1")
        mode = self._render_mode()
        view = RunView(schedule=self._scheduler()) if mode == "widget" else None
        text = _TextLines() if mode == "text" else None
        listeners = [sink for sink in (view, text) if sink is not None]
        extensions = [kernel_tools(lambda: self.ip.user_ns)] if args.kernel_tools else []
        handle = self.hub.start(
            target, prompt, context=context, max_turns=max_turns,
            listeners=listeners, view=view, extensions=extensions,
        )  # fmt: skip
        if args.background:
            if args.out:
                self.ip.user_ns[args.out] = handle
            return handle
        if view is not None:
            display(view)
        result = self._wait(handle, text)
        if args.out:
            self.ip.user_ns[args.out] = result
        if not result.success and not args.allow_failure:
            raise SpawnError(result)
        return result

    def _wait(self, handle: RunHandle, text: _TextLines | None) -> SpawnerResult:
        """Block the cell until the run ends; an interrupt cancels the run and re-raises."""
        try:
            while True:
                try:
                    return handle.job.future.result(timeout=0.05)
                except TimeoutError:
                    if text is not None:
                        text.drain()
        except KeyboardInterrupt:
            handle.job.cancel(wait=30)
            raise
        finally:
            if text is not None:
                text.drain()

    def _render_mode(self) -> str:
        if self.render != "auto":
            return str(self.render)
        return "widget" if _in_kernel() else "text"

    def _scheduler(self) -> Any:
        loop = self.hub.loop

        def schedule(delay: float, callback: Any) -> None:
            loop.loop.call_soon_threadsafe(loop.loop.call_later, delay, callback)

        return schedule

    def _target(self, args: Any) -> Target:
        runtime = args.runtime
        if runtime is not None and runtime not in available_runtimes():
            raise UsageError(
                f"unknown runtime {runtime!r}; available: {', '.join(available_runtimes())}"
            )
        try:
            if args.butler:
                butler = load_roster(args.roster or self.roster)[args.butler]
                if runtime:
                    butler = with_runtime(butler, runtime)
            else:
                butler = adhoc_butler(runtime or self.default_runtime, Path.cwd(), name="notebook")
        except SpawnkitError as exc:
            raise UsageError(str(exc)) from None
        replay = Path(args.replay).expanduser().resolve() if args.replay else None
        if replay is not None and not replay.is_file():
            raise UsageError(f"--replay: no scenario file at {replay}")
        return Target(butler, replay=replay, model=args.model, kernel_tools=args.kernel_tools)

    def _context(self, expression: str | None) -> str | None:
        if expression is None:
            return None
        try:
            value = self.ip.ev(expression)
        except Exception as exc:
            raise UsageError(
                f"--context {expression!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return value if isinstance(value, str) else str(value)

    # -- line magics -------------------------------------------------------------------

    @magic_arguments()
    @argument("-n", "--limit", type=int, default=20, help="how many sessions")
    @argument("--butler", help="only this butler")
    @line_magic
    def spawn_sessions(self, line: str) -> Any:
        """Recent sessions as a pandas DataFrame."""
        import pandas as pd

        args = parse_argstring(self.spawn_sessions, line)
        records = self.hub.store.list_sessions(butler=args.butler, limit=args.limit)
        frame = pd.DataFrame([r.to_dict() for r in records])
        if not frame.empty:
            for column in ("created_at", "started_at", "completed_at"):
                frame[column] = pd.to_datetime(frame[column], utc=True)
        return frame

    @line_magic
    def spawn_status(self, line: str) -> Any:
        """Slots in use and queue depth per butler this kernel has run."""
        import pandas as pd

        rows = [
            {"butler": s.butler, "running": s.active, "slots": s.capacity, "queued": s.queued,
             "max_queued": s.max_queued, "accepting": s.accepting}
            for s in self.hub.statuses()
        ]  # fmt: skip
        return pd.DataFrame(
            rows, columns=["butler", "running", "slots", "queued", "max_queued", "accepting"]
        )

    @line_magic
    def spawn_cancel(self, line: str) -> list[str]:
        """Cancel a run by session id (a prefix is enough), or ``all``."""
        which = line.strip()
        if not which:
            raise UsageError("usage: %spawn_cancel SESSION_ID|all")
        cancelled = self.hub.cancel(which)
        if which != "all" and not cancelled:
            raise UsageError(f"no run in flight matches {which!r}")
        return [h.session_id or "?" for h in cancelled]

    @line_magic
    def spawn_drain(self, line: str) -> dict[str, int]:
        """Wait for in-flight runs (default 30 s), then cancel what remains."""
        try:
            timeout = float(line.strip() or 30)
        except ValueError:
            raise UsageError("usage: %spawn_drain [TIMEOUT_SECONDS]") from None
        return self.hub.drain(timeout)

    @line_magic
    def spawn_dashboard(self, line: str) -> Any:
        """The butler dashboard for the roster (``%spawn_dashboard [ROSTER]``)."""
        from ..widgets import ButlerDashboard

        try:
            return ButlerDashboard(line.strip() or self.roster, hub=self.hub)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
