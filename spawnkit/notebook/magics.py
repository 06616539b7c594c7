"""IPython magics: ``%%spawn`` and the ``%spawn_*`` line magics.

A thin frontend: arguments are parsed with ``magic_arguments`` (so ``%%spawn?``
shows help and bad arguments raise ``UsageError``), the cell body is the
prompt, verbatim unless ``--interpolate``, and the run happens on spawnkit's
background loop through the kernel's :class:`~spawnkit.notebook.hub.Hub`.
"""

from __future__ import annotations

import sys
from argparse import ArgumentTypeError
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Enum, Integer, Unicode

from ..config.limits import Limits, positive_number
from ..errors import ConfigError, InvalidArgument
from ..result import SpawnerResult

if TYPE_CHECKING:
    from ..ask import AskResult
    from .hub import Hub, RunHandle

# The magics import what runs need (the hub, the views, the MCP server stack) when a magic
# is first used: `%load_ext spawnkit` only registers them (tests/test_notebook_startup.py).

STATUS_COLUMNS = [
    "butler", "running", "slots", "queued", "max_queued", "accepting", "wait_p50_s",
    "wait_p90_s", "cooldown_s", "cooldown_waits", "spent_today_usd", "daily_cost_usd",
]  # fmt: skip


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

    @property
    def ip(self) -> Any:
        """The shell these magics are registered with."""
        if self.shell is None:
            raise UsageError("spawnkit magics need an IPython shell")
        return self.shell

    @property
    def hub(self) -> Hub:
        from .hub import default_hub

        return default_hub()

    def close(self) -> None:
        hub = sys.modules.get(f"{__package__}.hub")
        if hub is not None:  # else no run was started: no hub to close
            hub.close_default_hub()

    # -- %%spawn ---------------------------------------------------------------------

    @magic_arguments()
    @argument("runtime", nargs="?", default=None, help="claude-code, codex or gemini")
    @argument("--butler", help="a butler from the roster (default: the notebook butler)")
    @argument("--roster", help="roster directory (default: SpawnMagics.roster)")
    @argument("--max-turns", type=int, help="maximum agent turns")
    @argument("--max-cost-usd", type=positive_number, help="stop the run when it has spent this")
    @argument("--max-tokens", type=int, help="stop the run at this many tokens (in + out)")
    @argument("--timeout-s", type=positive_number, help="stop the run after this many seconds")
    @argument("--model", help="model name for the runtime")
    @argument("--replay", help="play model turns from this scenario (offline)")
    @argument("--background", action="store_true", help="return a run handle at once")
    @argument(
        "--on",
        help="run on a Dask worker: dask (the default distributed client, else "
        "$SPAWNKIT_DASK_SCHEDULER) or a scheduler address",
    )
    @argument("--out", help="also bind the result (or handle) to this variable")
    @argument("--context", help="a Python expression whose value is put before the prompt")
    @argument("--interpolate", action="store_true", help="expand {var} and $var in the prompt")
    @argument("--allow-failure", action="store_true", help="return a failed result, not raise")
    @argument(
        "--continue",
        dest="continue_last",
        action="store_true",
        help="go on with this notebook's last run of the butler (same runtime)",
    )
    @argument("--resume", metavar="SESSION_ID", help="go on with this session (same runtime)")
    @argument("--kernel-tools", action="store_true", help="let the agent read kernel variables")
    @argument("--repo", help="edit a git worktree of this repository; Apply puts the diff back")
    @cell_magic
    def spawn(self, line: str, cell: str) -> SpawnerResult | RunHandle:
        """Run the cell as a prompt on an agent CLI; the value is the SpawnerResult."""
        from .failures import RunCancelled, RunFailed, remember
        from .runner import spawn

        args = parse_argstring(self.spawn, line)
        prompt = self.ip.var_expand(cell, depth=1) if args.interpolate else cell
        if not prompt.strip():
            raise UsageError("%%spawn needs a prompt in the cell body")
        max_turns = args.max_turns if args.max_turns is not None else self.max_turns
        if max_turns is not None and max_turns < 1:
            raise UsageError("--max-turns must be at least 1")
        try:
            outcome = spawn(
                prompt,
                runtime=args.runtime,
                butler=args.butler,
                roster=args.roster or self.roster,
                replay=args.replay,
                model=args.model,
                max_turns=max_turns,
                context=self._context(args.context),
                background=args.background,
                render=self.render,  # type: ignore[arg-type]  # an Enum trait of those values
                namespace=(lambda: self.ip.user_ns) if args.kernel_tools else None,
                default_runtime=self.default_runtime,
                limits=Limits(
                    max_cost_usd=args.max_cost_usd,
                    max_tokens=args.max_tokens,
                    timeout_s=args.timeout_s,
                ),
                on=args.on,
                repo=args.repo,
                continue_last=args.continue_last,
                resume=args.resume,
            )
        except (ConfigError, InvalidArgument) as exc:
            raise UsageError(str(exc)) from None
        except RunCancelled as stopped:
            if args.out:
                self.ip.user_ns[args.out] = stopped.result
            raise
        if args.out:
            self.ip.user_ns[args.out] = outcome
        if isinstance(outcome, SpawnerResult) and not outcome.success and not args.allow_failure:
            error = RunFailed(outcome)
            remember(error)
            raise error
        return outcome

    # -- %%ask -------------------------------------------------------------------------

    @magic_arguments()
    @argument("--sources", required=True, help="comma-separated names of registered sources")
    @argument("--runtime", help="the agent (default: [ask] default in ask.toml)")
    @argument("--replay", help="play model turns from this scenario (offline)")
    @argument("--out", help="also bind the result to this variable")
    @argument("--interpolate", action="store_true", help="expand {var} and $var in the question")
    @cell_magic
    def ask(self, line: str, cell: str) -> AskResult:
        """Ask the cell's question about the sources; the value renders the answer as Markdown."""
        from .asking import ask_cell

        args = parse_argstring(self.ask, line)
        question = self.ip.var_expand(cell, depth=1) if args.interpolate else cell
        if not question.strip():
            raise UsageError("%%ask needs a question in the cell body")
        try:
            result = ask_cell(question, args.sources, runtime=args.runtime, replay=args.replay)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        if args.out:
            self.ip.user_ns[args.out] = result
        return result

    # -- %%spawn_map ---------------------------------------------------------------------

    @magic_arguments()
    @argument("data", help="a DataFrame, Series or list in the namespace")
    @argument("--butler", required=True, help="a butler from the roster")
    @argument("--roster", help="roster directory (default: SpawnMagics.roster)")
    @argument("--runtimes", help="comma-separated runtimes, side by side (default: the butler's)")
    @argument("--max-concurrent", type=int, help="runs at once (default: the butler's slots)")
    @argument(
        "--max-cost-usd", type=positive_number, help="dispatch nothing more once this is spent"
    )
    @argument("--repo", help="give each run its own git worktree of this repository")
    @argument("--on", help="run on a Dask cluster: dask (the default client) or its address")
    @argument("--model", help="model name for the runtime")
    @argument("--replay", help="play model turns from this scenario (offline)")
    @argument("--out", help="also bind the DataFrame to this variable")
    @cell_magic
    def spawn_map(self, line: str, cell: str) -> Any:
        """Run the cell, a prompt template with ``{column}`` fields (``{prompt}`` for a list's
        items), once per row of DATA; the value is ``spawnkit.map``'s DataFrame (one row per
        input row and runtime)."""
        from ..cluster.batch import CONFIGURATION_REFUSALS
        from .batch import map as map_prompts

        args = parse_argstring(self.spawn_map, line)
        if not cell.strip():
            raise UsageError("%%spawn_map needs a prompt template in the cell body")
        if args.data not in self.ip.user_ns:
            raise UsageError(f"%%spawn_map: no variable {args.data!r} in the namespace")
        data = self.ip.user_ns[args.data]
        runtimes = [r.strip() for r in args.runtimes.split(",")] if args.runtimes else None
        try:
            frame = map_prompts(
                args.butler,
                data,
                template=cell.strip("\n"),
                runtimes=runtimes,
                repo=args.repo,
                cluster=args.on,
                max_concurrent=args.max_concurrent,
                max_cost_usd=args.max_cost_usd,
                roster=args.roster or self.roster,
                replay=args.replay,
                model=args.model,
                hub=self.hub,
            )
        except (*CONFIGURATION_REFUSALS, InvalidArgument) as exc:  # no key, no CLI: one line
            raise UsageError(str(exc)) from None
        if args.out:
            self.ip.user_ns[args.out] = frame
        return frame

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
        """Recent sessions, newest first: ``spawnkit.history.sessions()``'s columns and dtypes."""
        from ..history import sessions

        args = parse_argstring(self.spawn_sessions, line)
        if args.limit < 1:
            raise UsageError("-n must be at least 1")
        frame = sessions(self.hub.store, butler=args.butler)
        return frame.iloc[::-1].head(args.limit).reset_index(drop=True)

    @line_magic
    def spawn_debug(self, line: str) -> None:
        """The last failed or stopped run in full: error, logs, CLI stderr, Python traceback."""
        from .failures import debug_report

        print(debug_report(self.hub.store))

    @magic_arguments()
    @argument("--live", action="store_true", help="every host's runs, updated live (PostgreSQL)")
    @line_magic
    def spawn_status(self, line: str) -> Any:
        """Per butler this kernel has run: slots in use, queue depth, queue wait times
        (p50/p90 over its recent runs), the cool-down in effect after a rate limit, and
        today's spend against its daily budget. With ``--live``, on a PostgreSQL store: the
        runs open on every host sharing it, with their tool calls so far and the steps
        they took, updated as they happen (from the store's change feed, without polling)."""
        import pandas as pd

        args = parse_argstring(self.spawn_status, line)
        if args.live:
            from .widgets import LiveStatusView

            live = self.hub.live()
            if live is None:
                raise UsageError(
                    f"--live needs a PostgreSQL store (SPAWNKIT_STORE=postgresql://…); "
                    f"{self.hub.store.location} is a SQLite file only this machine writes"
                )
            return LiveStatusView(live, self.hub)
        rows = []
        butlers = self.hub.butlers()
        for s in self.hub.statuses():
            report = self.hub.queue_report(butlers[s.butler])
            rows.append(
                {"butler": s.butler, "running": s.active, "slots": s.capacity,
                 "queued": s.queued, "max_queued": s.max_queued, "accepting": s.accepting,
                 "wait_p50_s": report.wait_p50_s, "wait_p90_s": report.wait_p90_s,
                 "cooldown_s": report.cooldown_s, "cooldown_waits": report.cooldown_waits,
                 "spent_today_usd": report.spent_today_usd,
                 "daily_cost_usd": report.daily_cost_usd}
            )  # fmt: skip
        return pd.DataFrame(rows, columns=STATUS_COLUMNS)

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
            timeout = positive_number(line.strip() or "30")
        except ArgumentTypeError as exc:
            raise UsageError(f"usage: %spawn_drain [TIMEOUT_SECONDS]: {exc}") from None
        return self.hub.drain(timeout)

    @line_magic
    def spawn_dashboard(self, line: str) -> Any:
        """The butler dashboard for the roster (``%spawn_dashboard [ROSTER]``)."""
        from .widgets import ButlerDashboard

        try:
            return ButlerDashboard(line.strip() or self.roster, hub=self.hub)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
