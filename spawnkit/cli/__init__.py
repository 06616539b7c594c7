"""The ``spawnkit`` command line: a thin frontend that parses arguments and calls the core.

User mistakes and every other error the library raises on purpose (an unknown butler,
bad TOML, an unknown runtime, a missing variable or CLI, an empty prompt, a damaged or
read-only store) print one line and exit 2, never a traceback; a run that was accepted
and failed exits 1. Ctrl-C, SIGTERM and SIGHUP (``kill PID``, a closed terminal) cancel
the run alike: it is recorded as cancelled, its CLI's process group is terminated and its
workspace removed; ``spawnkit run`` then exits 130 for Ctrl-C and 128 + the signal's
number for the others (143 for SIGTERM, 129 for SIGHUP), and ``spawnkit serve`` stops
cleanly (exit 0) on any of the three.

Each command imports what it needs when it runs: ``spawnkit --version``, ``sessions``
and the adapter contract's ``check_status`` must not pay for the MCP server, the agent
SDK or OpenTelemetry (``benchmarks/cli_startup.py`` measures this).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .. import __version__
from ..errors import SpawnkitError
from ..home import STORE_VAR
from ..limits import positive_number

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from ..result import SpawnerResult
    from ..roster import ButlerConfig
    from ..store import SessionStore

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEMO_BUTLER = "health"
DEMO_SCENARIO = "scenarios/demo.toml"
DEMO_PROMPT = "I weighed 72.4 kg this morning"
# The most rows `-n` lists: a sane bound, far below what a database's LIMIT overflows at.
MAX_ROWS = 1_000_000


def read_prompt(value: str) -> str:
    """The prompt an argument stands for: ``-`` is stdin, ``@FILE`` a file's text.

    ``@@...`` is the literal text ``@...``. Any size works: the prompt never travels
    to an agent CLI as one command-line argument.
    """
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@@"):
        return value[1:]
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise SpawnkitError(f"the prompt file {path} is not UTF-8 text") from None
        except OSError as exc:
            raise SpawnkitError(
                f"cannot read the prompt file {path}: {exc.strerror or exc}"
            ) from None
    return value


def _load_roster(explicit: Path | None) -> Any:
    from ..roster import load_roster
    from ..roster_location import find_roster

    return load_roster(find_roster(explicit))


ROSTER_HELP = "roster directory (default: $SPAWNKIT_ROSTER, ./roster, then $SPAWNKIT_HOME/roster)"
STORE_HELP = (
    "the session store: a SQLite file or postgresql://user@host/db (default: $SPAWNKIT_STORE, "
    "[store] url in $SPAWNKIT_HOME/config.toml, then $SPAWNKIT_HOME/sessions.db)"
)
PROMPT_HELP = "the prompt; - reads it from stdin, @FILE from a file"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit 2, like every other error of the command line
    (its subcommands' parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"spawnkit: error: {message} (see {self.prog} --help)\n")


def row_count(text: str) -> int:
    """``-n``: a number of rows from 1 to :data:`MAX_ROWS`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MAX_ROWS:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_ROWS}, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="spawnkit",
        description="Spawn agent CLIs as ephemeral, locked-down butler runs, and log every one.",
    )
    parser.add_argument("--version", action="version", version=f"spawnkit {__version__}")
    parser.add_argument("--store", metavar="PATH_OR_URL", help=STORE_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run one prompt on a butler and stream its tool calls")
    run.add_argument("--roster", type=Path, default=None, help=ROSTER_HELP)
    run.add_argument("--butler", required=True, help="butler name")
    run.add_argument(
        "--runtime", help="run on this runtime instead of the butler's (claude-code, codex, gemini)"
    )
    run.add_argument("--max-turns", type=int, default=None, help="override max_turns")
    run.add_argument(
        "--max-cost-usd", type=positive_number, default=None, help="stop the run at this spend"
    )
    run.add_argument(
        "--max-tokens", type=int, default=None, help="stop the run at this many tokens (in + out)"
    )
    run.add_argument("--timeout-s", type=positive_number, default=None, help="override timeout_s")
    run.add_argument(
        "--replay", type=Path, metavar="SCENARIO", help="play model turns from a scenario"
    )
    run.add_argument(
        "--external-mcp",
        action="store_true",
        help="use the MCP server already serving the butler's port instead of starting one",
    )
    run.add_argument(
        "--context", default=None, help="context placed before the prompt (@FILE: a file's text)"
    )
    run.add_argument("--json", action="store_true", help="print the result as one JSON object")
    run.add_argument(
        "--on", metavar="SCHEDULER",
        help="run on a worker of this Dask cluster (tls://host:8786) instead of here",
    )  # fmt: skip
    run.add_argument("prompt", help=PROMPT_HELP)

    scheduler = commands.add_parser(
        "scheduler",
        help="start a secured Dask scheduler (tls://, certificates in $SPAWNKIT_HOME/cluster)",
        description="Starts `dask scheduler` on tls:// with the cluster's certificates, made "
        "on first use in $SPAWNKIT_HOME/cluster (0600 files in a 0700 folder) and kept: only "
        "holders of them can submit tasks or join. Another host joins with a copy: "
        "`spawnkit scheduler --export-credentials DIR`, copy DIR there, then `spawnkit worker "
        "--credentials DIR --scheduler tls://HOST:PORT` (or copy DIR to that host's "
        "$SPAWNKIT_HOME/cluster, which clients and workers read by default). Arguments after "
        "-- go to dask scheduler.",
    )
    scheduler.add_argument("--host", default="127.0.0.1", help="listen here (default: loopback)")
    scheduler.add_argument("--port", type=int, default=8786, help="default: 8786")
    scheduler.add_argument(
        "--export-credentials", type=Path, metavar="DIR",
        help="write what another host needs to join into DIR (new or empty) and exit",
    )  # fmt: skip
    scheduler.add_argument("scheduler_options", nargs="*", metavar="DASK_SCHEDULER_OPTION")

    worker = commands.add_parser(
        "worker",
        help="start a Dask worker that runs butlers' triggers (dask worker + spawnkit's plugin)",
        description="Starts `dask worker SCHEDULER --preload spawnkit.cluster_worker`: at "
        "start-up it checks the agent CLIs and the store (--store, else the default), and "
        "refuses to start when it cannot run agents. It joins only a secured (tls://) "
        "scheduler, with the certificates of `spawnkit scheduler` (--credentials DIR, else "
        "$SPAWNKIT_HOME/cluster), and listens on the address it reaches the scheduler from "
        "(loopback for a scheduler on loopback) unless given --host or --listen-address "
        "after --. Arguments after -- go to dask worker.",
    )
    worker.add_argument("--scheduler", required=True, metavar="ADDR", help="tls://host:8786")
    worker.add_argument(
        "--credentials", type=Path, metavar="DIR",
        help="the cluster's certificates (default: $SPAWNKIT_HOME/cluster)",
    )  # fmt: skip
    worker.add_argument(
        "--insecure", action="store_true",
        help="join a tcp:// scheduler: whoever reaches it or this worker can run code here",
    )  # fmt: skip
    worker.add_argument("worker_options", nargs="*", metavar="DASK_WORKER_OPTION")

    sessions = commands.add_parser("sessions", help="list recorded sessions, or show one")
    sessions.add_argument("session_id", nargs="?", help="show this session (a prefix is enough)")
    sessions.add_argument("--butler", help="only this butler")
    sessions.add_argument("--status", help="only this status (success, failed, cancelled, ...)")
    sessions.add_argument("-n", "--limit", type=row_count, default=20, help="at most this many")
    sessions.add_argument("--json", action="store_true")

    serve = commands.add_parser("serve", help="serve a butler's MCP server and schedule")
    serve.add_argument("butler", help="butler name")
    serve.add_argument("--roster", type=Path, default=None, help=ROSTER_HELP)
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
    roster.add_argument("--roster", type=Path, default=None, help=ROSTER_HELP)

    init = commands.add_parser(
        "init", help="create a roster with an example butler, a skill and a replay scenario"
    )
    init.add_argument(
        "directory", nargs="?", type=Path, default=Path("roster"),
        help="where to create it (default: ./roster); it must not exist or be empty",
    )  # fmt: skip

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
        else:
            p.add_argument(
                "--resume", metavar="SESSION", help="continue an ask's or a chat's session"
            )

    doctor = commands.add_parser(
        "doctor", help="check each runtime's CLI and that each butler's MCP server answers"
    )
    doctor.add_argument("--roster", type=Path, default=None, help=ROSTER_HELP)
    doctor.add_argument("--butler", help="check only this butler's MCP server")
    doctor.add_argument("--json", action="store_true")

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

    creds = commands.add_parser("credentials", help="values runs get for declared variables")
    creds_commands = creds.add_subparsers(dest="credentials_command", required=True)
    creds_set = creds_commands.add_parser(
        "set", help="store a value: piped on stdin, else asked for without echo"
    )
    creds_set.add_argument("name")
    creds_set.add_argument("value", nargs="?")
    creds_commands.add_parser("list", help="list stored names (never values)")
    creds_delete = creds_commands.add_parser("delete", help="remove a stored value")
    creds_delete.add_argument("name")

    store_cmd = commands.add_parser("store", help="check, repair or migrate the session store")
    store_commands = store_cmd.add_subparsers(dest="store_command", required=True)
    check = store_commands.add_parser(
        "check", help="check every page of the store; exit 1 if it is damaged"
    )
    check.add_argument("path", nargs="?", type=Path, help="default: $SPAWNKIT_HOME/sessions.db")
    check.add_argument(
        "--repair", action="store_true",
        help="copy every readable row into a fresh store; the damaged file is kept as a backup",
    )  # fmt: skip
    migrate = store_commands.add_parser(
        "migrate", help="copy a SQLite store into PostgreSQL (idempotent; counts verified)"
    )
    migrate.add_argument("path", nargs="?", type=Path, help="default: $SPAWNKIT_HOME/sessions.db")
    migrate.add_argument("--to", required=True, metavar="URL", help="postgresql://user@host/db")
    store_commands.add_parser(
        "replay",
        help="write the journaled writes a PostgreSQL server away could not take; exit 1 if "
        "some still wait",
    )

    hist = commands.add_parser("history", help="tokens, cost and tool calls, summed up")
    history_sources = ["store", "claude-code", "claude", "codex", "gemini"]
    hist.add_argument("--source", choices=history_sources, default="store",
                      help="spawnkit's store (default) or a CLI's own transcripts "
                      "(claude is claude-code)")  # fmt: skip
    hist.add_argument("--by", choices=["day", "group", "session"], default="day",
                      help="rows per day, per butler/project, or per session")  # fmt: skip
    hist.add_argument("--since", help="only activity from this date or time on (UTC)")
    hist.add_argument("--root", type=Path, help="the CLI's transcript folder (default: its own)")
    hist.add_argument("--machine", help="only this machine's imported transcripts")
    hist.add_argument("--prices", type=Path, help="a pricing table replacing the shipped one")
    hist.add_argument("-n", "--limit", type=row_count, default=None, help="at most this many rows")
    hist.add_argument("--json", action="store_true")
    hist_commands = hist.add_subparsers(dest="history_command", required=False)
    h_import = hist_commands.add_parser(
        "import", help="copy the CLIs' transcripts into the store, so they outlive the CLIs"
    )
    h_import.add_argument(
        "--source", dest="import_sources", action="append", choices=history_sources[1:],
        help="a CLI (repeatable; default: all three)",
    )  # fmt: skip
    h_import.add_argument(
        "--root", dest="import_root", type=Path,
        help="a CLI folder to read instead (e.g. another machine's ~/.claude)",
    )  # fmt: skip
    h_import.add_argument(
        "--machine", dest="import_machine",
        help="the machine the transcripts come from (default: this host)",
    )  # fmt: skip
    h_export = hist_commands.add_parser(
        "export", help="write the history as Parquet files DuckDB reads (views.sql)"
    )
    h_export.add_argument("folder", type=Path)
    h_export.add_argument(
        "--source", dest="export_sources", action="append",
        choices=["spawnkit", *history_sources[1:]],
        help="spawnkit (the store) or a CLI (repeatable; default: all)",
    )  # fmt: skip
    # `--store` is a global option, also accepted after the command (`spawnkit sessions
    # --store URL`); there it is kept only when given, so it never hides the global one.
    for command in commands.choices.values():
        command.add_argument("--store", metavar="PATH_OR_URL", default=argparse.SUPPRESS,
                             help=STORE_HELP)  # fmt: skip
    return parser


def _tracer_provider() -> TracerProvider:
    """Spans give each session a trace id; OTEL_TRACES_EXPORTER=console prints them."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider()
    if os.environ.get("OTEL_TRACES_EXPORTER") == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    return provider


def _quiet_sdk_logs() -> None:
    """The SDK logs a CLI that died as "Fatal error in message reader"; the run's own
    result says the same, with the CLI's exit code and stderr, once."""
    import logging

    logging.getLogger("claude_agent_sdk").setLevel(logging.CRITICAL)


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
    on: str | None = None,
) -> SpawnerResult:
    import asyncio

    from ..dispatch import Cluster
    from ..replay import Scenario
    from ..service import ButlerService
    from .console import EventPrinter

    _quiet_sdk_logs()
    printer = EventPrinter(sys.stderr if json_output else sys.stdout)
    provider = _tracer_provider()
    scenario = Scenario.load(replay) if replay else None
    cluster = Cluster(on, replay=scenario) if on else None
    options: dict[str, Any] = {"cluster": cluster} if cluster is not None else {}
    try:
        async with ButlerService(
            butler,
            store=store,
            replay=scenario,
            external_mcp=external_mcp,
            tracer_provider=provider,
            **options,
        ) as service:
            return await service.trigger(
                prompt, context=context, max_turns=max_turns, on_event=printer
            )
    finally:
        provider.shutdown()
        if cluster is not None:
            await asyncio.to_thread(cluster.close)


def cmd_run(args: argparse.Namespace) -> int:

    from .. import signals
    from ..limits import Limits
    from ..spawner import validate_request
    from ..store import SessionStore

    prompt = read_prompt(args.prompt)
    context = read_prompt(args.context) if args.context and args.context != "-" else args.context
    validate_request(prompt, args.max_turns)  # before the store or any server is touched
    limits = Limits(
        max_cost_usd=args.max_cost_usd, max_tokens=args.max_tokens, timeout_s=args.timeout_s
    ).validate()
    butler = _load_roster(args.roster)[args.butler].with_limits(limits)
    if args.runtime:
        butler = butler.with_runtime(args.runtime)
    store = SessionStore()
    result = signals.run(
        _run_once(
            butler, prompt, context=context, max_turns=args.max_turns,
            replay=args.replay, external_mcp=args.external_mcp, json_output=args.json,
            store=store, on=args.on,
        )
    )  # fmt: skip
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, default=str))
    _report_journal(store)
    return EXIT_OK if result.success else EXIT_FAILED


def _report_journal(store: SessionStore) -> None:
    """Say so when writes of the run wait in the journal for a server that went away."""
    waiting = store.pending_writes()
    store.close()
    if waiting and store.journal is not None:
        _say(
            f"spawnkit: the session store {store.location} went away: {waiting} write(s) of "
            f"the run are kept in {store.journal.path} and written when it is back (any "
            "spawnkit command that opens the store writes them)"
        )


def cmd_demo(args: argparse.Namespace) -> int:

    from .. import signals
    from ..roster import load_roster
    from ..roster_location import example_roster
    from ..store import SessionStore
    from .console import Style, render_session

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
        print(f"\nThe session record in {store.location}:\n", file=out)
        print(render_session(record, style), file=out)
    return EXIT_OK if result.success else EXIT_FAILED


def cmd_sessions(args: argparse.Namespace) -> int:
    from ..store import SessionStore
    from .console import Style, render_session, render_sessions_table

    store = SessionStore()  # opening it sweeps up the runs of dead owners (spawnkit.sweep)
    if args.session_id:
        matches = store.sessions_with_prefix(args.session_id, limit=2)
        if len(matches) != 1:
            what = "no session" if not matches else "several sessions"
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

    from .. import signals
    from ..replay import Scenario
    from ..service import ButlerService
    from .console import EventPrinter

    butler = _load_roster(args.roster)[args.butler]

    async def main() -> None:
        provider = _tracer_provider()
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


def cmd_roster(args: argparse.Namespace) -> int:
    roster = _load_roster(args.roster)
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

    from ..scaffold import STARTER_PROMPT, init_roster

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


def cmd_credentials(args: argparse.Namespace) -> int:
    from ..credential_file import CredentialFile, validate_name
    from ..errors import HomeNotWritable
    from ..store import SessionStore

    try:
        # Opening the store moves credentials an older spawnkit kept in it to the file.
        SessionStore().close()
    except HomeNotWritable:
        pass  # nothing can have been moved; the file's own reads and writes say what fails
    except SpawnkitError as exc:
        print(f"spawnkit: warning: {exc}", file=sys.stderr)
    credentials = CredentialFile.default()
    if args.credentials_command == "set":
        name = validate_name(args.name)
        if args.value is not None:
            print(
                "spawnkit: note: a value given as an argument shows in the process list and "
                f"your shell history; prefer `... | spawnkit credentials set {name}`",
                file=sys.stderr,
            )
        value = args.value if args.value is not None else _read_secret(name)
        credentials.set(name, value)
        print(f"stored {name} in {credentials.path}")
    elif args.credentials_command == "delete":
        if not credentials.delete(validate_name(args.name)):
            raise SpawnkitError(f"no stored credential named {args.name!r}")
        print(f"deleted {args.name}")
    else:
        for name in credentials.names():
            print(name)
    return EXIT_OK


def _read_secret(name: str) -> str:
    """A value from the terminal (not echoed) or, when piped, all of stdin minus one newline."""
    import getpass

    from ..credential_file import MAX_VALUE_BYTES, CredentialError

    if sys.stdin is not None and sys.stdin.isatty():
        return getpass.getpass(f"{name}: ")
    data = sys.stdin.buffer.read(MAX_VALUE_BYTES + 1) if sys.stdin is not None else b""
    if len(data) > MAX_VALUE_BYTES:
        raise CredentialError(f"the value of {name} is longer than {MAX_VALUE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialError(f"the value of {name} on stdin is not UTF-8 text") from None
    return text.removesuffix("\n").removesuffix("\r")


def cmd_sources(args: argparse.Namespace) -> int:
    from ..sources import SourceRegistry

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
    from ..credentials import CredentialStore
    from ..service import REPLAY_API_KEY, REPLAY_KEYS
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


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..doctor import check_roster_mcp, check_runtimes
    from ..roster_location import RosterNotFound

    runtimes = check_runtimes()
    try:
        roster = _load_roster(args.roster)
    except RosterNotFound as exc:
        if args.roster is not None or args.butler:
            raise
        roster, no_roster = None, str(exc)
    butlers = [roster[args.butler]] if roster and args.butler else list(roster or [])
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


def cmd_adapter(args: argparse.Namespace) -> int:
    from .. import contract
    from ..runtimes import canonical_runtime

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


def cmd_history(args: argparse.Namespace) -> int:
    from .. import history

    # A model without a price is worth one line, not a warning with a source location.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", history.UnpricedModelWarning)
        lines = _history(args, history)
    for warning in caught:
        print(f"spawnkit: warning: {warning.message}", file=sys.stderr)
    print(lines)
    return EXIT_OK


def _history(args: argparse.Namespace, history: Any) -> str:
    if args.history_command == "import":
        out = []
        for report in history.import_history(
            args.import_sources, args.import_root, machine=args.import_machine
        ):
            out.append(report.line())
            out.extend(f"  skipped {path}: {reason}" for path, reason in report.skipped)
        return "\n".join(out)
    if args.history_command == "export":
        folder = history.export(args.folder, args.export_sources or history.export_sources())
        return f"wrote {folder} (DuckDB: cd {folder} && duckdb -c '.read views.sql')"
    pricing = history.PricingTable.load(args.prices) if args.prices else None
    table = history.report.summarize(
        args.source, view=args.by, root=args.root, since=args.since, limit=args.limit,
        pricing=pricing, machine=args.machine,
    )  # fmt: skip
    return str(history.report.to_json(table) if args.json else history.report.render_table(table))


def cmd_store(args: argparse.Namespace) -> int:
    from ..home import default_store_path
    from ..store import check_store

    if args.store_command == "replay":
        return _replay_journal()
    path = args.path or default_store_path()
    if not path.exists():
        raise SpawnkitError(f"no session store at {path}")
    if args.store_command == "migrate":
        return _migrate(path, args.to)
    if args.repair:
        return _repair(path)
    health = check_store(path)
    if health.healthy:
        print(f"{health.path}: ok (schema {health.schema_version}, {health.sessions} sessions)")
        return EXIT_OK
    print(f"{health.path}: damaged", file=sys.stderr)
    for problem in health.problems:
        print(f"  {problem}", file=sys.stderr)
    print(f"repair it with: spawnkit store check --repair {path}", file=sys.stderr)
    return EXIT_FAILED


def _replay_journal() -> int:
    from ..store import SessionStore

    with SessionStore() as store:  # opening it replays what it can
        journal = store.journal
        if journal is None:
            print(f"{store.location}: a local file, nothing is ever journaled")
            return EXIT_OK
        waiting, failed = journal.pending(), journal.failed()
    print(f"{store.location}: {waiting} write(s) waiting in {journal.path}, {len(failed)} failed")
    for entry_id, op, session_id, why in failed:
        print(f"  failed #{entry_id}: {op} of session {session_id}: {why}", file=sys.stderr)
    return EXIT_OK if not waiting and not failed else EXIT_FAILED


def _repair(path: Path) -> int:
    from ..store_repair import repair_store

    report = repair_store(path)
    if report.backup is None:
        print(f"{path}: ok, nothing to repair")
        return EXIT_OK
    print(f"{path}: rebuilt from every readable row; the damaged file is kept as {report.backup}")
    for table in report.tables:
        if not table.reachable:
            state = "LOST: the table itself could not be read"
        elif table.unreadable:
            state = f"{table.recovered} rows recovered, up to {table.unreadable} unreadable"
        else:
            state = f"{table.recovered} rows recovered, none lost"
        print(f"  {table.name:<12} {state}")
    for name in report.lost_precious:
        print(
            f"warning: some rows of {name!r} could not be read: check `spawnkit credentials "
            f"list` and set the missing ones again; the backup {report.backup} keeps the rest",
            file=sys.stderr,
        )
    return EXIT_OK if report.complete else EXIT_FAILED


def _migrate(path: Path, url: str) -> int:
    from ..store_migrate import migrate_store

    report = migrate_store(path, url)
    print(f"{report.source} -> {report.target}")
    for t in report.tables:
        state = "verified" if t.verified else f"ONLY {t.present} FOUND IN THE TARGET"
        print(
            f"  {t.name:<11} {t.source:>8} rows: {t.copied} copied, {t.already} already there; "
            f"{state}"
        )
    if report.verified:
        return EXIT_OK
    print("spawnkit: error: some rows are missing from the target; run it again", file=sys.stderr)
    return EXIT_FAILED


def cmd_worker(args: argparse.Namespace) -> int:
    from ..dispatch import require_distributed

    require_distributed()  # says how to install it when it is missing (exit 2)
    from ..cluster_worker import check_worker, exec_worker, reach_scheduler, secured_worker

    scheduler, options, credentials = secured_worker(
        args.scheduler, args.worker_options, credentials=args.credentials, insecure=args.insecure
    )
    if credentials is None:
        _say(f"spawnkit worker: WARNING: {scheduler} is not secured (--insecure)")
    # Checked before Dask starts: once started, a worker whose plugin fails is closed, but
    # `dask worker` then exits 0, which a supervisor takes for a clean stop.
    report = check_worker()
    if not report.ready:
        _say(f"spawnkit worker: this host cannot run agents: {report.problem}")
        return EXIT_USAGE
    reach_scheduler(scheduler, credentials)  # one line, not Dask's traceback, when out of reach
    exec_worker(scheduler, options)
    return EXIT_OK  # not reached: this process became the worker


def cmd_scheduler(args: argparse.Namespace) -> int:
    from ..dispatch import require_distributed

    require_distributed()
    from ..cluster_security import ensure_credentials, export_credentials, scheduler_command

    credentials = ensure_credentials()
    if args.export_credentials is not None:
        target = export_credentials(credentials, args.export_credentials)
        print(f"{target}: copy it to the worker's host, then: spawnkit worker --credentials "
              f"{target} --scheduler tls://THIS_HOST:{args.port}")  # fmt: skip
        return EXIT_OK
    command = scheduler_command(args.host, args.port, credentials, args.scheduler_options)
    _say(f"spawnkit scheduler: certificates in {credentials.directory}")
    os.execv(command[0], command)  # this process becomes the scheduler


COMMANDS = {
    "run": cmd_run,
    "scheduler": cmd_scheduler,
    "worker": cmd_worker,
    "demo": cmd_demo,
    "sessions": cmd_sessions,
    "serve": cmd_serve,
    "replay": cmd_replay,
    "roster": cmd_roster,
    "init": cmd_init,
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
        with _store_chosen(args.store):
            return COMMANDS[args.command](args)
    except SpawnkitError as exc:
        from ..signals import Stopped  # imported here: it loads asyncio

        if isinstance(exc, Stopped):
            _say(f"spawnkit: {exc}; the run was cancelled and recorded")
            return exc.exit_code
        print(f"spawnkit: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say("spawnkit: interrupted; the run was cancelled and recorded")
        return EXIT_INTERRUPTED


@contextlib.contextmanager
def _store_chosen(store: str | None) -> Iterator[None]:
    """``--store`` as ``$SPAWNKIT_STORE`` while the command runs: every store it opens, and
    the workers it starts, use it."""
    if store is None:
        yield
        return
    previous = os.environ.get(STORE_VAR)
    os.environ[STORE_VAR] = store
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(STORE_VAR, None)
        else:
            os.environ[STORE_VAR] = previous


def one_line(message: str) -> str:
    """An error message as one line (an agent's stderr tail may span several)."""
    return " | ".join(line.strip() for line in message.strip().splitlines() if line.strip())


def _say(line: str) -> None:
    """A last line on stderr, which may be a terminal that is gone (SIGHUP)."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
