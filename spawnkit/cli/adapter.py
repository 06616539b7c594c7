"""``spawnkit adapter RUNTIME COMMAND``: the shell adapter contract for orchestrators
(docs/adapter-contract.md). ``spawn`` and ``resume`` print a session id and leave the
session to a detached ``_worker`` process; ``check_status`` must stay cheap, since
orchestrators poll it. A contract error prints its own line and exits with its own code."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .parsing import PROMPT_HELP, Commands, read_prompt
from .reporting import EXIT_FAILED, EXIT_OK


def add_adapter(commands: Commands) -> None:
    adapter = commands.add_parser(
        "adapter",
        help="the shell adapter contract for orchestrators (see docs/adapter-contract.md)",
    )
    adapter.add_argument("runtime", help="claude-code, codex or gemini")
    adapter.add_argument(
        "--roster", type=Path, help="the roster of --butler (default: as for every command)"
    )
    adapter.add_argument(
        "--butler", help="a butler of the roster (default: the brief is the prompt)"
    )
    adapter.add_argument("--replay", type=Path, metavar="SCENARIO", help="offline model turns")
    contract = adapter.add_subparsers(
        dest="contract_command", required=True, metavar="COMMAND", title="commands"
    )
    contract.add_parser("capabilities", help="print the runtime's capabilities as JSON")
    c_spawn = contract.add_parser("spawn", help="start a session; prints its id")
    c_spawn.add_argument("brief", type=Path)
    c_spawn.add_argument("state", type=Path)
    c_spawn.add_argument("prompt", help=PROMPT_HELP)
    c_resume = contract.add_parser("resume", help="continue a session; prints the new id")
    c_resume.add_argument("session_id")
    c_resume.add_argument("state", type=Path)
    c_resume.add_argument("prompt", help=PROMPT_HELP)
    c_status = contract.add_parser("check_status", help="pending, active, completed or failed")
    c_status.add_argument("session_id")
    c_sub = contract.add_parser("spawn_subagent", help="start a session as a role; prints its id")
    c_sub.add_argument("role")
    c_sub.add_argument("brief", type=Path)
    c_sub.add_argument("state", type=Path)
    c_sub.add_argument("prompt", help=PROMPT_HELP)
    c_mcp = contract.add_parser(
        "start_mcp_server", help="serve the butler's MCP server; prints its pid"
    )
    c_mcp.add_argument(
        "config", nargs="?", metavar="BUTLER_OR_CONFIG",
        help="a butler's name, or the path of its butler.toml or folder (or give --butler)",
    )  # fmt: skip
    # The detached worker spawn and resume start: internal, so kept out of every help text.
    worker = contract.add_parser("_worker")
    contract._choices_actions = [a for a in contract._choices_actions if a.dest != "_worker"]
    worker.add_argument("--session-id", required=True)
    worker.add_argument("--brief", type=Path, required=True)
    worker.add_argument("--state", type=Path, required=True)
    worker.add_argument("--resume-from")
    worker.add_argument("--role")
    worker.add_argument("--prompt-file", type=Path, required=True)


def cmd_adapter(args: argparse.Namespace) -> int:
    from ..runtimes import canonical_runtime
    from . import contract

    args.runtime = canonical_runtime(args.runtime)
    try:
        return _adapter(args, contract)
    except contract.ContractError as exc:
        print(f"spawnkit adapter: {exc}", file=sys.stderr)
        return exc.code


def _adapter(args: argparse.Namespace, contract: Any) -> int:
    from ..store import SessionStore

    command = args.contract_command
    if command == "capabilities":
        print(json.dumps(contract.capabilities(args.runtime)))
        return EXIT_OK
    options = contract.Options(args.runtime, args.roster, args.butler, args.replay)
    if command == "start_mcp_server":
        print(contract.start_mcp_server(options, args.config))
        return EXIT_OK
    store = SessionStore()
    if command == "check_status":
        print(contract.check_status(args.session_id, store))
    elif command == "spawn":
        prompt = read_prompt(args.prompt)
        print(contract.spawn(options, args.brief, args.state, prompt, store=store))
    elif command == "spawn_subagent":
        prompt = read_prompt(args.prompt)
        print(contract.spawn(options, args.brief, args.state, prompt, role=args.role, store=store))
    elif command == "resume":
        prompt = read_prompt(args.prompt)
        print(contract.resume(options, args.session_id, args.state, prompt, store=store))
    else:  # _worker: run the session in this (detached) process
        result = contract.run_worker(
            options, args.session_id, args.brief, args.state, contract.read_prompt_file(
                args.prompt_file
            ), resume_from=args.resume_from, role=args.role, store=store,
        )  # fmt: skip
        return EXIT_OK if result.success else EXIT_FAILED
    return EXIT_OK
