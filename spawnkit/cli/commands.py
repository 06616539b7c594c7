"""The ``spawnkit`` command: the parser built from every command group's arguments, and
``main``, which runs one command and turns the errors the library raises on purpose into
one line and an exit code (see :mod:`spawnkit.cli.reporting`). The console script and
``python -m spawnkit`` run :func:`process_main`, which is ``main`` for a process that ends
after it."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from .. import __version__
from ..errors import SpawnkitError
from ..home import STORE_VAR
from . import acp, adapter, ask, cluster, credentials, history, roster, runs, serve, store
from .parsing import STORE_HELP, Commands, Parser
from .reporting import EXIT_INTERRUPTED, EXIT_USAGE, one_line, say


class Command(NamedTuple):
    """A command: what adds its parser (arguments and help), and what runs it."""

    add_parser: Callable[[Commands], None]
    run: Callable[[argparse.Namespace], int]


# In the order `spawnkit --help` lists them.
COMMANDS = {
    "run": Command(runs.add_run, runs.cmd_run),
    "apply": Command(runs.add_apply, runs.cmd_apply),
    "scheduler": Command(cluster.add_scheduler, cluster.cmd_scheduler),
    "worker": Command(cluster.add_worker, cluster.cmd_worker),
    "sessions": Command(history.add_sessions, history.cmd_sessions),
    "serve": Command(serve.add_serve, serve.cmd_serve),
    "replay": Command(serve.add_replay, serve.cmd_replay),
    "demo": Command(runs.add_demo, runs.cmd_demo),
    "roster": Command(roster.add_roster, roster.cmd_roster),
    "init": Command(roster.add_init, roster.cmd_init),
    "sources": Command(ask.add_sources, ask.cmd_sources),
    "ask": Command(ask.add_ask, ask.cmd_ask),
    "chat": Command(ask.add_chat, ask.cmd_chat),
    "doctor": Command(roster.add_doctor, roster.cmd_doctor),
    "install-clis": Command(roster.add_install_clis, roster.cmd_install_clis),
    "adapter": Command(adapter.add_adapter, adapter.cmd_adapter),
    "credentials": Command(credentials.add_credentials, credentials.cmd_credentials),
    "store": Command(store.add_store, store.cmd_store),
    "acp": Command(acp.add_acp, acp.cmd_acp),
    "history": Command(history.add_history, history.cmd_history),
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="spawnkit",
        description="Spawn agent CLIs as ephemeral, locked-down butler runs, and log every one.",
    )
    parser.add_argument("--version", action="version", version=f"spawnkit {__version__}")
    parser.add_argument("--store", metavar="PATH_OR_URL", help=STORE_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(commands)
    # `--store` is a global option, also accepted after the command and its subcommand
    # (`spawnkit sessions --store URL`, `spawnkit store check --store URL`); there it is
    # kept only when given, so it never hides the global one.
    for subparser in _subparsers(parser):
        subparser.add_argument("--store", metavar="PATH_OR_URL", default=argparse.SUPPRESS,
                               help=STORE_HELP)  # fmt: skip
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every command's and subcommand's parser under ``parser``, at any depth."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):  # aliases: once each
                yield subparser
                yield from _subparsers(subparser)


def process_main(argv: Sequence[str] | None = None) -> int:
    """:func:`main` as the ``spawnkit`` program, whose process ends after it returns.

    A command that ran a butler has a few hundred thousand objects in memory (the MCP
    server, pydantic's schemas, the agent SDK), and the interpreter's own exit walked them
    all in its last garbage collections: 0.7 to 0.9 s after ``spawnkit run`` or
    ``spawnkit acp`` had done everything (docs/benchmarks.md). They are frozen out of those
    collections (``gc.freeze``) once the command has returned: the exit still runs every
    ``atexit`` handler and frees what the modules hold; only garbage in reference cycles
    is left for the process's end to take. In-process callers use :func:`main`."""
    code = main(argv)
    gc.freeze()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with _store_chosen(args.store):
            return COMMANDS[args.command].run(args)
    except SpawnkitError as exc:
        from ..signals import Stopped  # imported here: it loads asyncio

        if isinstance(exc, Stopped):
            say(f"spawnkit: {exc}; the run was cancelled and recorded")
            return exc.exit_code
        print(f"spawnkit: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("spawnkit: interrupted; the run was cancelled and recorded")
        return EXIT_INTERRUPTED


@contextlib.contextmanager
def _store_chosen(store: str | None) -> Iterator[None]:
    """``--store`` as ``$SPAWNKIT_STORE`` while the command runs: every store it opens, and
    the workers it starts, use it."""
    if store is None:
        yield
        return
    if _has_password(store):
        print(
            "spawnkit: warning: the password in --store can be read by every user of this "
            "machine (in its process list) and stays in your shell's history; give the URL "
            f"in ${STORE_VAR} or [store] url of config.toml instead, or the password in "
            "~/.pgpass or $PGPASSWORD",
            file=sys.stderr,
        )
    previous = os.environ.get(STORE_VAR)
    os.environ[STORE_VAR] = store
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(STORE_VAR, None)
        else:
            os.environ[STORE_VAR] = previous


def _has_password(store: str) -> bool:
    """Whether a store URL carries a password (a file path never does)."""
    from urllib.parse import urlsplit

    try:
        return "://" in store and urlsplit(store).password is not None
    except ValueError:  # not a URL this can read: the store says why when it opens
        return False


if __name__ == "__main__":
    sys.exit(main())
