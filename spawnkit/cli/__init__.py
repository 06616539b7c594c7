"""The ``spawnkit`` command line: a thin frontend that parses arguments and calls the core.

One module per command group, each adding its commands' arguments and running them:
``runs`` (run, demo), ``cluster`` (scheduler, worker), ``serve`` (serve, replay),
``roster`` (roster, init, doctor), ``ask`` (sources, ask, chat), ``history`` (sessions,
history), ``store``, ``credentials`` and ``adapter`` (the shell adapter contract).
``parsing`` holds what their arguments share, ``reporting`` the exit codes and one-line
errors, ``commands`` the parser and ``main``, ``console`` the terminal rendering of runs
and sessions (which the notebook's terminal view uses too).

Each command imports what it needs when it runs: ``spawnkit --version``, ``sessions``
and the adapter contract's ``check_status`` must not pay for the MCP server, the agent
SDK or OpenTelemetry (``benchmarks/cli_startup.py`` measures this).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .commands import build_parser, main, process_main

__all__ = ["build_parser", "main", "process_main"]


def __getattr__(name: str) -> Any:
    """``main``, ``process_main`` and ``build_parser`` on first use: the notebook imports
    ``console`` from here and should not pay for building the command line."""
    if name in __all__:
        from . import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
