"""``spawnkit roster``, ``spawnkit init``, ``spawnkit doctor`` and ``spawnkit install-clis``:
the butlers a roster holds, a new roster to start from, whether this host can run them
(each runtime's CLI found, each butler's MCP server answering), and the pinned node CLIs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .parsing import ROSTER_HELP, Commands, find_and_load_roster
from .reporting import EXIT_FAILED, EXIT_OK


def add_roster(commands: Commands) -> None:
    roster = commands.add_parser("roster", help="validate a roster and list its butlers")
    roster.add_argument("--roster", type=Path, default=None, help=ROSTER_HELP)


def add_init(commands: Commands) -> None:
    init = commands.add_parser(
        "init", help="create a roster with an example butler, a skill and a replay scenario"
    )
    init.add_argument(
        "directory", nargs="?", type=Path, default=Path("roster"),
        help="where to create it (default: ./roster); it must not exist or be empty",
    )  # fmt: skip


def add_doctor(commands: Commands) -> None:
    doctor = commands.add_parser(
        "doctor", help="check each runtime's CLI and that each butler's MCP server answers"
    )
    doctor.add_argument("--roster", type=Path, default=None, help=ROSTER_HELP)
    doctor.add_argument("--butler", help="check only this butler's MCP server")
    doctor.add_argument("--json", action="store_true")


def add_install_clis(commands: Commands) -> None:
    commands.add_parser(
        "install-clis",
        help="install the pinned Codex and Gemini CLIs (and the ACP adapters) with npm into "
        "$SPAWNKIT_HOME/clis, where spawnkit finds them",
    )


def cmd_install_clis(args: argparse.Namespace) -> int:
    from ..runtimes.npm_clis import install_clis, pinned_versions

    pinned = ", ".join(f"{name}@{version}" for name, version in pinned_versions().items())
    print(f"installing {pinned} with npm ...", flush=True)
    where = install_clis()
    print(f"installed into {where}; `spawnkit doctor` shows what each runtime uses")
    return EXIT_OK


def cmd_roster(args: argparse.Namespace) -> int:
    roster = find_and_load_roster(args.roster)
    print(f"roster {roster.directory}: {len(roster)} butler(s)")
    for b in roster:
        r = b.runtime
        print(
            f"  {b.name:<14} {r.type:<12} port {b.port:<5} {b.mcp_transport:<4} "
            f"slots {r.max_concurrent_sessions}, queue {r.max_queued_sessions}, "
            f"{len(b.schedules)} schedule(s), {len(b.skills())} skill(s)"
        )
        if r.command is not None and (warning := r.command.prompt_on_command_line()):
            print(f"spawnkit: warning: {b.config_file}: {warning}", file=sys.stderr)
    return EXIT_OK


def cmd_init(args: argparse.Namespace) -> int:
    import shlex

    from ..config.scaffold import STARTER_PROMPT, init_roster

    made = init_roster(args.directory)
    shown = args.directory.expanduser()
    print(f"created a roster in {made.directory} with the butler {made.butler!r}:")
    for file in made.files:
        print(f"  {shown / file}")
    found_anyway = shown == Path("roster") and not os.environ.get("SPAWNKIT_ROSTER")
    roster_flag = "" if found_anyway else f" --roster {shlex.quote(str(shown))}"
    scenario = shlex.quote(str(shown / made.scenario.relative_to(made.directory)))
    print(
        "\nrun it offline, on the replay model:\n"
        f"  spawnkit run{roster_flag} --butler {made.butler} --replay {scenario} "
        f"{shlex.quote(STARTER_PROMPT)}\n"
        f"on the real model (needs ANTHROPIC_API_KEY), drop --replay; list the roster with "
        f"`spawnkit roster{roster_flag}`"
    )
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..config.roster_location import RosterNotFound
    from ..doctor import check_acp_agents, check_roster_mcp, check_runtimes

    runtimes = check_runtimes()
    try:
        roster = find_and_load_roster(args.roster)
    except RosterNotFound as exc:
        if args.roster is not None or args.butler:
            raise
        roster, no_roster = None, str(exc)
    butlers = [roster[args.butler]] if roster and args.butler else list(roster or [])
    runtimes += check_acp_agents(butlers)
    servers = check_roster_mcp(butlers)
    failed = not all(c.found for c in runtimes) or not all(
        c.ok and c.port_status != "other" for c in servers
    )
    if args.json:
        print(json.dumps({"runtimes": [c.to_dict() for c in runtimes],
                          "mcp_servers": [c.to_dict() for c in servers]}))  # fmt: skip
        return EXIT_FAILED if failed else EXIT_OK
    print("runtimes:")
    for c in runtimes:
        if c.found:
            print(f"  {c.runtime:<12} ok       {c.version or '?'}  ({c.path})")
        else:
            print(f"  {c.runtime:<12} missing  install it with: {c.install}")
    if any(not c.found and c.install and c.install.startswith("npm ") for c in runtimes):
        print("  (`spawnkit install-clis` installs the pinned Codex and Gemini into "
              "$SPAWNKIT_HOME/clis, where spawnkit finds them)")  # fmt: skip
    if roster is None:
        print(f"MCP servers: not checked: {no_roster}")
    else:
        print(f"MCP servers (roster {roster.directory}):")
    for m in servers:
        if m.ok:
            where = {
                "free": f"port {m.port} free (runs start their own server; only --external-mcp "
                f"needs one there: `spawnkit serve {m.butler}`)",
                "serving": f"port {m.port} serves it (--external-mcp runs can use it)",
                "other": f"port {m.port} is taken by something that is not this butler's MCP "
                "server: --external-mcp runs and `spawnkit serve` will fail",
            }[m.port_status]
            status = "ok    " if m.port_status != "other" else "FAILED"
            print(f"  {m.butler:<12} {status}   answers over {m.transport} "
                  f"({len(m.tools)} tools); {where}")  # fmt: skip
        else:
            print(f"  {m.butler:<12} FAILED   its MCP server does not answer: {m.error}")
    from ..history.retention import claude_cleanup_warnings

    for warning in claude_cleanup_warnings():
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK
