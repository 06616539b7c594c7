"""``spawnkit acp --butler NAME``: the butler as an Agent Client Protocol agent on stdio.

An ACP client (Zed, JetBrains, Jupyter AI) starts this command and speaks JSON-RPC on its
stdin and stdout (:mod:`spawnkit.serve.acp`); each prompt is a run of the butler through
the same service ``spawnkit run`` starts (:func:`spawnkit.cli.runs.serving`). stdout
belongs to the protocol from the first moment: everything else spawnkit says goes to
stderr, which clients keep as the agent's log.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from pathlib import Path

from .parsing import ROSTER_HELP, Commands, find_and_load_roster
from .reporting import EXIT_OK


def add_acp(commands: Commands) -> None:
    acp = commands.add_parser(
        "acp", help="serve a butler as an ACP agent on stdio (for Zed, JetBrains, Jupyter AI)"
    )
    acp.add_argument("--butler", required=True, help="butler name")
    acp.add_argument("--roster", type=Path, default=None, help=ROSTER_HELP)
    acp.add_argument(
        "--replay", type=Path, metavar="SCENARIO", help="play model turns from a scenario"
    )


def cmd_acp(args: argparse.Namespace) -> int:
    from ..serve.acp.wire import claim_stdio

    # Before anything can print: fd 1 becomes stderr, the protocol keeps the real stdout.
    stdio = claim_stdio()
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("SPAWNKIT_ACP_LOG", "WARNING").upper(),
        format="spawnkit acp: %(levelname)s %(name)s: %(message)s",
    )
    # A roster error is told before the protocol's modules load (the butler's service
    # loads its own beside the protocol: see serve.acp.startup).
    butler = find_and_load_roster(args.roster)[args.butler]

    from .. import __version__, signals
    from ..serve.acp.agent import serve_stdio
    from ..store import SessionStore
    from .runs import serving

    store = SessionStore()

    # Started beside the protocol: initialize is answered before the service is up.
    start = functools.partial(serving, butler, replay=args.replay, store=store)

    async def main() -> None:
        await serve_stdio(butler, store, start, stdio, version=__version__)

    try:
        signals.run(main())
    except signals.Stopped:
        pass  # SIGTERM/SIGHUP (a client stopping its agent): the runs were cancelled
    finally:
        store.close()
    return EXIT_OK
