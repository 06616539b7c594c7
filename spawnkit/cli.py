"""The ``spawnkit`` command line: a thin frontend that parses arguments and calls the core.

User mistakes (an unknown butler, bad TOML, an unknown runtime, a missing
variable or CLI) print one line and exit 2, never a traceback; a run that was
accepted and failed exits 1. Ctrl-C, SIGTERM and SIGHUP (``kill PID``, a closed
terminal) cancel the run alike: it is recorded as cancelled, its CLI's process group is
terminated and its workspace removed; ``spawnkit run`` then exits 130 for Ctrl-C and
128 + the signal's number for the others (143 for SIGTERM, 129 for SIGHUP), and
``spawnkit serve`` stops cleanly (exit 0) on any of the three.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from . import __version__, signals
from .console import EventPrinter, Style, render_session, render_sessions_table
from .errors import RuntimeNotFoundError, SpawnkitError
from .replay import Scenario, record_forever, serve_forever
from .result import SpawnerResult
from .roster import ButlerConfig, Roster, load_roster
from .runtimes import available_runtimes, get_adapter
from .service import ButlerService
from .store import SessionStore

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEMO_BUTLER = "health"
DEMO_SCENARIO = "scenarios/demo.toml"
DEMO_PROMPT = "I weighed 72.4 kg this morning"


def default_roster() -> Path:
    return Path(os.environ.get("SPAWNKIT_ROSTER", "roster"))


def example_roster() -> Path:
    """The roster in the current directory, else the wheel's copy, else the checkout's.

    An editable install has no packaged copy: its examples are the ``roster/`` beside
    the ``spawnkit/`` package in the source checkout.
    """
    package = Path(str(resources.files("spawnkit")))
    candidates = (Path("roster"), package / "_examples" / "roster", package.parent / "roster")
    for roster in candidates:
        if (roster / DEMO_BUTLER / "butler.toml").is_file():
            return roster
    return candidates[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spawnkit",
        description="Spawn agent CLIs as ephemeral, locked-down butler runs, and log every one.",
    )
    parser.add_argument("--version", action="version", version=f"spawnkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run one prompt on a butler and stream its tool calls")
    run.add_argument(
        "--roster", type=Path, default=None, help="roster directory (default ./roster)"
    )
    run.add_argument("--butler", required=True, help="butler name")
    run.add_argument("--max-turns", type=int, default=None, help="override max_turns")
    run.add_argument(
        "--replay", type=Path, metavar="SCENARIO", help="play model turns from a scenario"
    )
    run.add_argument(
        "--external-mcp",
        action="store_true",
        help="use the MCP server already serving the butler's port instead of starting one",
    )
    run.add_argument("--context", default=None, help="context placed before the prompt")
    run.add_argument("--json", action="store_true", help="print the result as one JSON object")
    run.add_argument("prompt", help="the prompt")

    sessions = commands.add_parser("sessions", help="list recorded sessions, or show one")
    sessions.add_argument("session_id", nargs="?", help="show this session (a prefix is enough)")
    sessions.add_argument("--butler", help="only this butler")
    sessions.add_argument("--status", help="only this status (success, failed, cancelled, ...)")
    sessions.add_argument("-n", "--limit", type=int, default=20)
    sessions.add_argument("--json", action="store_true")

    serve = commands.add_parser("serve", help="serve a butler's MCP server and schedule")
    serve.add_argument("butler", help="butler name")
    serve.add_argument("--roster", type=Path, default=None)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=None, help="default: the butler's port")
    serve.add_argument("--replay", type=Path, metavar="SCENARIO", help="runs use this scenario")

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

    demo = commands.add_parser("demo", help="run an example butler offline, end to end")
    demo.add_argument("--json", action="store_true")

    roster = commands.add_parser("roster", help="validate a roster and list its butlers")
    roster.add_argument("--roster", type=Path, default=None)

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

    for name, what in (("ask", "ask a question about sources"), ("chat", "chat about sources")):
        p = commands.add_parser(name, help=what)
        p.add_argument("--sources", required=True, help="comma-separated source names")
        p.add_argument("--runtime", help="agent to use (default: [ask] default in ask.toml)")
        p.add_argument("--replay", type=Path, metavar="SCENARIO", help="offline model turns")
        if name == "ask":
            p.add_argument("--json", action="store_true", help="print the result as JSON")
            p.add_argument("question")

    doctor = commands.add_parser("doctor", help="find each runtime's CLI and report versions")
    doctor.add_argument("--json", action="store_true")

    adapter = commands.add_parser(
        "adapter",
        help="the shell adapter contract for orchestrators (see docs/adapter-contract.md)",
    )
    adapter.add_argument("runtime", help="claude-code, codex or gemini")
    adapter.add_argument("--roster", type=Path, help="run as a roster butler (with --butler)")
    adapter.add_argument(
        "--butler", help="a butler of the roster (default: the brief is the prompt)"
    )
    adapter.add_argument("--replay", type=Path, metavar="SCENARIO", help="offline model turns")
    contract = adapter.add_subparsers(dest="contract_command", required=True)
    contract.add_parser("capabilities", help="print the runtime's capabilities as JSON")
    c_spawn = contract.add_parser("spawn", help="start a session; prints its id")
    c_spawn.add_argument("brief", type=Path)
    c_spawn.add_argument("state", type=Path)
    c_spawn.add_argument("prompt")
    c_resume = contract.add_parser("resume", help="continue a session; prints the new id")
    c_resume.add_argument("session_id")
    c_resume.add_argument("state", type=Path)
    c_resume.add_argument("prompt")
    c_status = contract.add_parser("check_status", help="pending, active, completed or failed")
    c_status.add_argument("session_id")
    c_sub = contract.add_parser("spawn_subagent", help="start a session as a role; prints its id")
    c_sub.add_argument("role")
    c_sub.add_argument("brief", type=Path)
    c_sub.add_argument("state", type=Path)
    c_sub.add_argument("prompt")
    contract.add_parser("start_mcp_server", help="serve the butler's MCP server; prints its pid")
    worker = contract.add_parser("_worker", help=argparse.SUPPRESS)
    worker.add_argument("--session-id", required=True)
    worker.add_argument("--brief", type=Path, required=True)
    worker.add_argument("--state", type=Path, required=True)
    worker.add_argument("--resume-from")
    worker.add_argument("--role")
    worker.add_argument("prompt")

    creds = commands.add_parser("credentials", help="values runs get for declared variables")
    creds_commands = creds.add_subparsers(dest="credentials_command", required=True)
    creds_set = creds_commands.add_parser("set", help="store a value (asked for when omitted)")
    creds_set.add_argument("name")
    creds_set.add_argument("value", nargs="?")
    creds_commands.add_parser("list", help="list stored names (never values)")
    creds_delete = creds_commands.add_parser("delete", help="remove a stored value")
    creds_delete.add_argument("name")

    store_cmd = commands.add_parser("store", help="check the session store")
    store_commands = store_cmd.add_subparsers(dest="store_command", required=True)
    check = store_commands.add_parser(
        "check", help="check every page of the store; exit 1 if it is damaged"
    )
    check.add_argument("path", nargs="?", type=Path, help="default: $SPAWNKIT_HOME/sessions.db")

    hist = commands.add_parser("history", help="tokens, cost and tool calls, summed up")
    hist.add_argument("--source", choices=["store", "claude", "codex", "gemini"], default="store",
                      help="spawnkit's store (default) or a CLI's own transcripts")  # fmt: skip
    hist.add_argument("--by", choices=["day", "group", "session"], default="day",
                      help="rows per day, per butler/project, or per session")  # fmt: skip
    hist.add_argument("--since", help="only activity from this date or time on (UTC)")
    hist.add_argument("--root", type=Path, help="the CLI's transcript folder (default: its own)")
    hist.add_argument("--prices", type=Path, help="a pricing table replacing the shipped one")
    hist.add_argument("-n", "--limit", type=int, default=None, help="at most this many rows")
    hist.add_argument("--json", action="store_true")
    return parser


def _tracer_provider() -> TracerProvider:
    """Spans give each session a trace id; OTEL_TRACES_EXPORTER=console prints them."""
    provider = TracerProvider()
    if os.environ.get("OTEL_TRACES_EXPORTER") == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    return provider


async def _run_once(
    butler: ButlerConfig,
    prompt: str,
    *,
    context: str | None,
    max_turns: int | None,
    replay: Path | None,
    external_mcp: bool,
    json_output: bool,
    store: SessionStore,
) -> SpawnerResult:
    printer = EventPrinter(sys.stderr if json_output else sys.stdout)
    provider = _tracer_provider()
    try:
        async with ButlerService(
            butler,
            store=store,
            replay=Scenario.load(replay) if replay else None,
            external_mcp=external_mcp,
            tracer_provider=provider,
        ) as service:
            return await service.trigger(prompt, context, max_turns=max_turns, on_event=printer)
    finally:
        provider.shutdown()


def cmd_run(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster or default_roster())
    butler = roster[args.butler]
    store = SessionStore()
    result = signals.run(
        _run_once(
            butler, args.prompt, context=args.context, max_turns=args.max_turns,
            replay=args.replay, external_mcp=args.external_mcp, json_output=args.json,
            store=store,
        )
    )  # fmt: skip
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, default=str))
    return EXIT_OK if result.success else EXIT_FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    roster = load_roster(example_roster())
    butler = roster[DEMO_BUTLER]
    out = sys.stderr if args.json else sys.stdout
    style = Style.for_stream(out)
    print(
        style.bold("spawnkit demo")
        + f": the {butler.name!r} butler runs the real Claude Code CLI, offline, against\n"
        "spawnkit's replay model server, with its own MCP server and skills.\n"
        f"prompt: {DEMO_PROMPT!r}\n",
        file=out,
    )
    store = SessionStore()
    result = signals.run(
        _run_once(
            butler, DEMO_PROMPT, context=None, max_turns=None,
            replay=butler.directory / DEMO_SCENARIO, external_mcp=False, json_output=args.json,
            store=store,
        )
    )  # fmt: skip
    record = store.get_session(result.session_id or "")
    if args.json:
        print(json.dumps(record.to_dict() if record else result.to_dict(), default=str))
    elif record is not None:
        print(f"\nThe session record in {store.path}:\n", file=out)
        print(render_session(record, style), file=out)
    return EXIT_OK if result.success else EXIT_FAILED


def cmd_sessions(args: argparse.Namespace) -> int:
    store = SessionStore()  # opening it sweeps up the runs of dead owners (spawnkit.sweep)
    if args.session_id:
        matches = [r for r in store.list_sessions(limit=10_000) if r.id.startswith(args.session_id)]
        if len(matches) != 1:
            what = "no session" if not matches else f"{len(matches)} sessions"
            raise SpawnkitError(f"{what} match {args.session_id!r}")
        record = matches[0]
        if args.json:
            print(json.dumps(record.to_dict(), ensure_ascii=False))
        else:
            print(render_session(record, Style.for_stream(sys.stdout)))
        return EXIT_OK
    records = store.list_sessions(butler=args.butler, status=args.status, limit=args.limit)
    if args.json:
        print(json.dumps([r.to_dict() for r in records], ensure_ascii=False))
    else:
        print(render_sessions_table(records))
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster or default_roster())
    butler = roster[args.butler]

    async def main() -> None:
        provider = _tracer_provider()
        async with ButlerService(
            butler,
            replay=Scenario.load(args.replay) if args.replay else None,
            mcp_port=butler.port if args.port is None else args.port,
            mcp_host=args.host,
            schedules=True,
            tracer_provider=provider,
        ) as service:
            spawner = service.spawner
            spawner.add_listener(EventPrinter(sys.stdout))
            schedules = service.scheduler.next_runs() if service.scheduler else {}
            print(f"serving butler {butler.name!r}: MCP at {service.mcp_url}{butler.mcp_path}")
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
    if args.replay_command == "serve":
        serve_forever(args.scenario, args.host, args.port)
    else:
        record_forever(args.upstream, args.out, args.host, args.port)
    return EXIT_OK


def cmd_roster(args: argparse.Namespace) -> int:
    roster: Roster = load_roster(args.roster or default_roster())
    print(f"roster {roster.directory}: {len(roster)} butler(s)")
    for b in roster:
        r = b.runtime
        print(
            f"  {b.name:<14} {r.type:<12} port {b.port:<5} {b.mcp_transport:<4} "
            f"slots {r.max_concurrent_sessions}, queue {r.max_queued_sessions}, "
            f"{len(b.schedules)} schedule(s), {len(b.skills())} skill(s)"
        )
    return EXIT_OK


def cmd_credentials(args: argparse.Namespace) -> int:
    store = SessionStore()
    if args.credentials_command == "set":
        value = args.value if args.value is not None else getpass.getpass(f"{args.name}: ")
        store.credential_set(args.name, value)
        print(f"stored {args.name}")
    elif args.credentials_command == "delete":
        if not store.credential_delete(args.name):
            raise SpawnkitError(f"no stored credential named {args.name!r}")
        print(f"deleted {args.name}")
    else:
        for name in store.credential_names():
            print(name)
    return EXIT_OK


def cmd_sources(args: argparse.Namespace) -> int:
    from .sources import SourceRegistry

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
    from .credentials import CredentialStore
    from .service import REPLAY_API_KEY, REPLAY_KEYS

    if replaying:
        return dict.fromkeys(REPLAY_KEYS, REPLAY_API_KEY)
    credentials = CredentialStore(SessionStore())
    names = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")
    return {name: value for name in names if (value := credentials.resolve(name))}


def cmd_ask(args: argparse.Namespace) -> int:
    from .ask import ask
    from .replay import ReplayServer

    async def run() -> Any:
        if args.replay is None:
            return await ask(
                args.sources, args.question, runtime=args.runtime, env=_agent_env(False)
            )
        async with ReplayServer(Scenario.load(args.replay)).serve() as url:
            return await ask(
                args.sources, args.question, runtime=args.runtime, base_url=url,
                env=_agent_env(True),
            )  # fmt: skip

    result = asyncio.run(run())
    if args.json:
        print(json.dumps({"answer": result.answer, "runtime": result.runtime,
                          "session_id": result.session_id, "sources": list(result.sources),
                          "duration_s": round(result.duration_s, 3)}))  # fmt: skip
    else:
        print(result.answer)
    return EXIT_OK


def cmd_chat(args: argparse.Namespace) -> int:
    from .ask import chat
    from .replay import ReplayServer

    if args.replay is None:
        return chat(args.sources, runtime=args.runtime, env=_agent_env(False))
    with ReplayServer(Scenario.load(args.replay)).serve_in_thread() as url:
        return chat(args.sources, runtime=args.runtime, base_url=url, env=_agent_env(True))


def cmd_doctor(args: argparse.Namespace) -> int:
    rows = []
    for runtime in available_runtimes():
        adapter = get_adapter(runtime)()
        try:
            path = adapter.find_binary()
        except RuntimeNotFoundError as exc:
            rows.append({"runtime": runtime, "found": False, "install": exc.install_hint})
            continue
        rows.append(
            {
                "runtime": runtime,
                "found": True,
                "path": str(path),
                "version": asyncio.run(adapter.binary_version()),
            }
        )
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            if row["found"]:
                print(f"{row['runtime']:<12} ok       {row['version'] or '?'}  ({row['path']})")
            else:
                print(f"{row['runtime']:<12} missing  install it with: {row['install']}")
    return EXIT_OK if all(row["found"] for row in rows) else EXIT_FAILED


def cmd_adapter(args: argparse.Namespace) -> int:
    from . import contract

    if args.runtime not in available_runtimes():
        raise SpawnkitError(
            f"unknown runtime {args.runtime!r}; available: {', '.join(available_runtimes())}"
        )
    try:
        return _adapter(args, contract)
    except contract.ContractError as exc:
        print(f"spawnkit adapter: {exc}", file=sys.stderr)
        return exc.code


def _adapter(args: argparse.Namespace, contract: Any) -> int:
    command = args.contract_command
    if command == "capabilities":
        print(json.dumps(contract.capabilities(args.runtime)))
        return EXIT_OK
    options = contract.Options(args.runtime, args.roster, args.butler, args.replay)
    if command == "start_mcp_server":
        print(contract.start_mcp_server(options))
        return EXIT_OK
    store = SessionStore()
    if command == "check_status":
        print(contract.check_status(args.session_id, store))
    elif command == "spawn":
        print(contract.spawn(options, args.brief, args.state, args.prompt, store=store))
    elif command == "spawn_subagent":
        print(
            contract.spawn(
                options, args.brief, args.state, args.prompt, role=args.role, store=store
            )
        )
    elif command == "resume":
        print(contract.resume(options, args.session_id, args.state, args.prompt, store=store))
    else:  # _worker: run the session in this (detached) process
        result = contract.run_worker(
            options, args.session_id, args.brief, args.state, args.prompt,
            resume_from=args.resume_from, role=args.role, store=store,
        )  # fmt: skip
        return EXIT_OK if result.success else EXIT_FAILED
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    from . import history

    pricing = history.PricingTable.load(args.prices) if args.prices else None
    table = history.report.summarize(
        args.source, view=args.by, root=args.root, since=args.since, limit=args.limit,
        pricing=pricing,
    )  # fmt: skip
    print(history.report.to_json(table) if args.json else history.report.render_table(table))
    return EXIT_OK


def cmd_store(args: argparse.Namespace) -> int:
    from .home import default_store_path
    from .store import check_store

    health = check_store(args.path or default_store_path())
    if health.healthy:
        print(f"{health.path}: ok (schema {health.schema_version}, {health.sessions} sessions)")
        return EXIT_OK
    print(f"{health.path}: damaged", file=sys.stderr)
    for problem in health.problems:
        print(f"  {problem}", file=sys.stderr)
    return EXIT_FAILED


COMMANDS = {
    "run": cmd_run,
    "demo": cmd_demo,
    "sessions": cmd_sessions,
    "serve": cmd_serve,
    "replay": cmd_replay,
    "roster": cmd_roster,
    "credentials": cmd_credentials,
    "doctor": cmd_doctor,
    "sources": cmd_sources,
    "ask": cmd_ask,
    "chat": cmd_chat,
    "adapter": cmd_adapter,
    "history": cmd_history,
    "store": cmd_store,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except signals.Stopped as exc:
        _say(f"spawnkit: {exc}; the run was cancelled and recorded")
        return exc.exit_code
    except SpawnkitError as exc:
        print(f"spawnkit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say("spawnkit: interrupted; the run was cancelled and recorded")
        return EXIT_INTERRUPTED


def _say(line: str) -> None:
    """A last line on stderr, which may be a terminal that is gone (SIGHUP)."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
