"""``spawnkit sources``, ``spawnkit ask`` and ``spawnkit chat``: named folders, files and
git repositories, and an agent that answers questions about them (once, or in a chat)
with spawnkit's stored API keys, or offline on a replay scenario."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .parsing import Commands, read_prompt
from .reporting import EXIT_OK


def add_sources(commands: Commands) -> None:
    sources = commands.add_parser("sources", help="named folders, files and git repos to ask about")
    sources_commands = sources.add_subparsers(dest="sources_command", required=True)
    s_add = sources_commands.add_parser("add", help="register a source")
    s_add.add_argument("name")
    s_add.add_argument("location", help="a folder, a file, or a git URL or repository")
    s_add.add_argument("--git", action="store_true", help="clone LOCATION as a git source")
    s_add.add_argument("--branch", help="the git branch to follow")
    s_list = sources_commands.add_parser("list", help="list registered sources")
    s_list.add_argument("--json", action="store_true")
    s_remove = sources_commands.add_parser("remove", help="forget a source (and its clone)")
    s_remove.add_argument("name")
    s_update = sources_commands.add_parser("update", help="pull git sources (all, or one)")
    s_update.add_argument("name", nargs="?")


def _add_agent(commands: Commands, name: str, what: str) -> argparse.ArgumentParser:
    """The options ``ask`` and ``chat`` share: which sources, which agent, offline turns."""
    p: argparse.ArgumentParser = commands.add_parser(name, help=what)
    p.add_argument("--sources", required=True, help="comma-separated source names")
    p.add_argument("--runtime", help="agent to use (default: [ask] default in ask.toml)")
    p.add_argument("--replay", type=Path, metavar="SCENARIO", help="offline model turns")
    return p


def add_ask(commands: Commands) -> None:
    p = _add_agent(commands, "ask", "ask a question about sources")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("question")


def add_chat(commands: Commands) -> None:
    p = _add_agent(commands, "chat", "chat about sources")
    p.add_argument("--resume", metavar="SESSION", help="continue an ask's or a chat's session")


def cmd_sources(args: argparse.Namespace) -> int:
    from ..containment.sources import SourceRegistry

    registry = SourceRegistry()
    if args.sources_command == "add":
        source = registry.add(
            args.name, args.location, kind="git" if args.git else None, branch=args.branch
        )
        print(f"added {source.kind} source {source.name!r}: {source.location}")
    elif args.sources_command == "remove":
        print(f"removed {registry.remove(args.name).name!r}")
    elif args.sources_command == "update":
        for source in registry.update(args.name):
            print(f"updated {source.name!r} ({source.kind}) {source.commit or ''}".rstrip())
    elif args.json:
        print(json.dumps([s.to_toml() | {"name": s.name} for s in registry.list()], default=str))
    else:
        for source in registry.list():
            print(f"{source.name:<16} {source.kind:<9} {source.location}")
    return EXIT_OK


def _agent_env(replaying: bool) -> dict[str, str]:
    """API keys for an ask/chat agent: spawnkit's credentials, or the replay key."""
    from ..containment.credentials import CredentialStore
    from ..serve.service import REPLAY_API_KEY, REPLAY_KEYS
    from ..store import SessionStore

    if replaying:
        return dict.fromkeys(REPLAY_KEYS, REPLAY_API_KEY)
    credentials = CredentialStore(SessionStore())
    names = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")
    return {name: value for name in names if (value := credentials.resolve(name))}


def cmd_ask(args: argparse.Namespace) -> int:
    import asyncio

    from ..ask import ask
    from ..replay import ReplayServer, Scenario

    question = read_prompt(args.question)

    async def run() -> Any:
        if args.replay is None:
            return await ask(args.sources, question, runtime=args.runtime, env=_agent_env(False))
        async with ReplayServer(Scenario.load(args.replay)).serve() as url:
            return await ask(
                args.sources, question, runtime=args.runtime, base_url=url,
                env=_agent_env(True),
            )  # fmt: skip

    result = asyncio.run(run())
    if args.json:
        print(json.dumps({"answer": result.answer, "runtime": result.runtime,
                          "session_id": result.session_id, "record_id": result.record_id,
                          "sources": list(result.sources),
                          "duration_s": round(result.duration_s, 3)}))  # fmt: skip
    else:
        print(result.answer)
    return EXIT_OK


def cmd_chat(args: argparse.Namespace) -> int:
    from ..ask import chat
    from ..replay import ReplayServer, Scenario

    if args.replay is None:
        return chat(args.sources, runtime=args.runtime, resume=args.resume, env=_agent_env(False))
    scenario = Scenario.load(args.replay)  # a bad scenario fails before anything starts
    with ReplayServer(scenario).serve_in_thread() as url:
        return chat(
            args.sources, runtime=args.runtime, resume=args.resume, base_url=url,
            env=_agent_env(True),
        )  # fmt: skip
