"""``spawnkit serve`` and ``spawnkit replay``: the long-running servers, a butler's MCP
server with its schedule, and the replay model server (playing a scenario, or recording
one from a real API). Each runs until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .parsing import ROSTER_HELP, Commands, find_and_load_roster
from .reporting import EXIT_OK


def add_serve(commands: Commands) -> None:
    serve = commands.add_parser("serve", help="serve a butler's MCP server and schedule")
    serve.add_argument("butler", help="butler name")
    serve.add_argument("--roster", type=Path, default=None, help=ROSTER_HELP)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=None, help="default: the butler's port")
    serve.add_argument("--replay", type=Path, metavar="SCENARIO", help="runs use this scenario")


def add_replay(commands: Commands) -> None:
    replay = commands.add_parser("replay", help="the replay model server")
    replay_commands = replay.add_subparsers(dest="replay_command", required=True)
    replay_serve = replay_commands.add_parser("serve", help="play a scenario as a model API")
    replay_serve.add_argument("scenario", type=Path)
    replay_serve.add_argument("--host", default="127.0.0.1")
    replay_serve.add_argument("--port", type=int, default=0)
    record = replay_commands.add_parser("record", help="proxy a real API and write a scenario")
    record.add_argument("--upstream", required=True, help="e.g. https://api.anthropic.com")
    record.add_argument("--out", type=Path, required=True, help="scenario file to write")
    record.add_argument("--host", default="127.0.0.1")
    record.add_argument("--port", type=int, default=0)


def cmd_serve(args: argparse.Namespace) -> int:

    from .. import signals
    from ..replay import Scenario
    from ..serve.service import ButlerService
    from .console import EventPrinter
    from .runs import tracer_provider

    butler = find_and_load_roster(args.roster)[args.butler]

    async def main() -> None:
        provider = tracer_provider()
        async with ButlerService(
            butler,
            replay=Scenario.load(args.replay) if args.replay else None,
            mcp_port=butler.port if args.port is None else args.port,
            mcp_host=args.host,
            schedules=True,
            tracer_provider=provider,
            owner_token=True,
        ) as service:
            spawner = service.spawner
            spawner.add_listener(EventPrinter(sys.stdout))
            schedules = service.scheduler.next_runs() if service.scheduler else {}
            print(f"serving butler {butler.name!r}: MCP at {service.mcp_url}{butler.mcp_path}")
            print(f"  token file: {service.token_file}")
            print("  (readable only by you; MCP clients send 'Authorization: Bearer <token>')")
            for name, when in schedules.items():
                print(f"  schedule {name}: next run {when.isoformat()}")
            print(
                "Ctrl-C or SIGTERM stops (in-flight runs are cancelled and recorded).", flush=True
            )
            await service.serve_forever()

    try:
        signals.run(main())
    except (KeyboardInterrupt, signals.Stopped):
        print("stopped", file=sys.stderr)
    return EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    from ..replay import record_forever, serve_forever

    if args.replay_command == "serve":
        serve_forever(args.scenario, args.host, args.port)
    else:
        record_forever(args.upstream, args.out, args.host, args.port)
    return EXIT_OK
