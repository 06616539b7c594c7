"""``spawnkit run`` and ``spawnkit demo``: one prompt on a butler, its tool calls streamed
to the terminal as they happen, and the result (or its JSON) at the end; ``spawnkit apply``:
the changes of a ``run --repo``, kept in its record, put into its repository.

``serve`` starts runs too and shares the tracer provider made here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.limits import positive_number
from .parsing import PROMPT_HELP, ROSTER_HELP, Commands, find_and_load_roster, read_prompt
from .reporting import EXIT_FAILED, EXIT_OK, say

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from ..config.roster import ButlerConfig
    from ..result import SpawnerResult
    from ..serve.service import ButlerService
    from ..store import SessionRecord, SessionStore

DEMO_BUTLER = "health"
DEMO_SCENARIO = "scenarios/demo.toml"
DEMO_PROMPT = "I weighed 72.4 kg this morning"


def add_run(commands: Commands) -> None:
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
    run.add_argument(
        "--repo", type=Path, metavar="PATH",
        help="edit a git worktree of this repository (HEAD plus its uncommitted changes); "
        "the repository is unchanged until `spawnkit apply SESSION_ID`",
    )  # fmt: skip
    run.add_argument("prompt", help=PROMPT_HELP)


def add_apply(commands: Commands) -> None:
    apply = commands.add_parser(
        "apply", help="put the changes a `spawnkit run --repo` run made into its repository"
    )
    apply.add_argument("session_id", nargs="?", help="the run's session (a prefix is enough)")
    apply.add_argument(
        "--last", action="store_true", help="the latest run made with --repo, whichever it was"
    )
    apply.add_argument(
        "--print", action="store_true", dest="print_diff",
        help="print the diff instead (for `git apply` or a review), change nothing",
    )  # fmt: skip


def add_demo(commands: Commands) -> None:
    demo = commands.add_parser("demo", help="run an example butler offline, end to end")
    demo.add_argument("--json", action="store_true")


def tracer_provider() -> TracerProvider:
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


@contextlib.asynccontextmanager
async def serving(
    butler: ButlerConfig,
    *,
    replay: Path | None,
    store: SessionStore,
    external_mcp: bool = False,
    on: str | None = None,
) -> AsyncIterator[ButlerService]:
    """The butler's service as ``spawnkit run`` starts it (replay server, MCP server, spans,
    or a Dask cluster), for one run or for the prompts of ``spawnkit acp``."""
    import asyncio
    import importlib

    # In a thread, as the scenario below: `spawnkit acp` answers its client while the
    # service's modules load (the MCP server, the runtimes: seconds on a loaded machine).
    await asyncio.to_thread(importlib.import_module, "..serve.service", __package__)
    from ..replay import Scenario
    from ..run.dispatch import Cluster
    from ..serve.service import ButlerService

    _quiet_sdk_logs()
    provider = tracer_provider()
    # In a thread: `spawnkit acp` answers its client while the service starts.
    scenario = await asyncio.to_thread(Scenario.load, replay) if replay else None
    cluster = Cluster(on, replay=scenario) if on else None
    options: dict[str, Any] = {"cluster": cluster} if cluster is not None else {}
    try:
        if cluster is not None:
            await cluster.connect()  # out of reach: one line, before the butler starts
        async with ButlerService(
            butler,
            store=store,
            replay=scenario,
            external_mcp=external_mcp,
            tracer_provider=provider,
            **options,
        ) as service:
            yield service
    finally:
        provider.shutdown()
        if cluster is not None:
            await asyncio.to_thread(cluster.close)


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
    ask_terminal: bool = False,
    repo: Path | None = None,
) -> SpawnerResult:
    from .approving import terminal_approver
    from .console import EventPrinter

    printer = EventPrinter(sys.stderr if json_output else sys.stdout)
    async with serving(
        butler, replay=replay, store=store, external_mcp=external_mcp, on=on
    ) as service:
        return await service.trigger(
            prompt, context=context, max_turns=max_turns, on_event=printer,
            # [butler.permissions] ask: y/N on a terminal; elsewhere nobody answers.
            approver=terminal_approver() if ask_terminal else None,
            repo=repo,
        )  # fmt: skip


def check_runnable(butler: ButlerConfig, store: SessionStore, *, replayed: bool) -> None:
    """What a run of ``butler`` needs of this machine, checked before any server starts:
    its CLI, its required variables, and an API key or login (unless ``replayed``: the
    replay server gives the run its key). Raises the user's error, which says how to fix
    it (:class:`~spawnkit.errors.RuntimeNotFoundError`, ``MissingEnvError``,
    ``MissingApiKeyError``). The spawner checks the same again at each trigger."""
    from ..containment.credentials import CredentialStore, check_required, run_values
    from ..runtimes import get_adapter

    adapter = get_adapter(butler.runtime.type)(butler.runtime)
    adapter.find_binary()
    credentials = CredentialStore(store)
    check_required(butler, credentials)
    if not replayed:
        adapter.check_authenticated(
            run_values(butler, credentials, adapter.passthrough_env, adapter.other_vendor_keys)
        )


def cmd_run(args: argparse.Namespace) -> int:

    from .. import signals
    from ..config.limits import Limits
    from ..run import validate_request
    from ..store import SessionStore

    prompt = read_prompt(args.prompt)
    context = read_prompt(args.context) if args.context and args.context != "-" else args.context
    validate_request(prompt, args.max_turns, context)  # before the store or any server is touched
    if args.on:
        from ..containment.cluster_security import checked_scheduler_address

        checked_scheduler_address(args.on)
    limits = Limits(
        max_cost_usd=args.max_cost_usd, max_tokens=args.max_tokens, timeout_s=args.timeout_s
    ).validate()
    if args.repo is not None:
        from ..worktree import RepoStart

        RepoStart.of(args.repo)  # one line before anything starts: not a git repository
    butler = find_and_load_roster(args.roster)[args.butler].with_limits(limits)
    if args.runtime:
        butler = butler.with_runtime(args.runtime)
    store = SessionStore()
    if not args.on and not args.external_mcp:  # else the worker or the server's host has them
        # A missing CLI, variable or key in a second, not after the butler's server and
        # the run's stack have been loaded and started (three seconds here).
        check_runnable(butler, store, replayed=args.replay is not None)
    result = signals.run(
        _run_once(
            butler, prompt, context=context, max_turns=args.max_turns,
            replay=args.replay, external_mcp=args.external_mcp, json_output=args.json,
            store=store, on=args.on, ask_terminal=True, repo=args.repo,
        )
    )  # fmt: skip
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, default=str))
    if result.repo is not None:
        _report_change(result, sys.stderr if args.json else sys.stdout)
    _report_journal(store)
    return EXIT_OK if result.success else EXIT_FAILED


def _report_change(result: SpawnerResult, out: Any) -> None:
    """What the run changed in its repository (git's diff stat), and how to apply it."""
    change = result.repo
    assert change is not None
    if not change.diff.strip():
        print(f"\nThe run changed nothing in {change.repo}.", file=out)
        return
    print(f"\nChanges to {change.repo} (not applied yet):\n{change.stat().rstrip()}", file=out)
    print(
        f"Apply them: spawnkit apply {result.session_id}    "
        f"(see the diff: spawnkit apply {result.session_id} --print)",
        file=out,
        flush=True,
    )


def cmd_apply(args: argparse.Namespace) -> int:
    """Apply a ``--repo`` run's diff, kept in its record, to the repository it ran on."""
    from ..errors import SpawnkitError
    from ..store import SessionStore
    from ..worktree import RepoChange

    if (args.session_id is None) == (not args.last):
        raise SpawnkitError("name the run's session, or give --last (not both)")
    store = SessionStore()
    try:
        if args.last:
            matches = [r for r in store.list_sessions(limit=LAST_LOOKED_AT) if _repo_change(r)]
            if not matches:
                raise SpawnkitError(
                    f"none of the last {LAST_LOOKED_AT} runs in {store.location} changed a "
                    "repository (`spawnkit run --repo PATH`)"
                )
        else:
            matches = store.sessions_with_prefix(args.session_id, limit=2)
    finally:
        store.close()
    if len(matches) != 1 and not args.last:
        what = "no session" if not matches else "several sessions"
        raise SpawnkitError(f"{what} match {args.session_id!r}")
    record = matches[0]
    kept = _repo_change(record)
    if kept is None:
        raise SpawnkitError(
            f"session {record.id} has no repository diff (it was not run with --repo"
            + (", or has not finished)" if record.completed_at is None else ")")
        )
    change = RepoChange.from_dict(kept)
    if args.print_diff:
        sys.stdout.write(change.diff)
        return EXIT_OK
    touched = change.apply()
    if not touched:
        print(f"session {record.id} changed nothing in {change.repo}")
        return EXIT_OK
    print(f"Applied to {change.repo}: {', '.join(touched)}")
    return EXIT_OK


# How many of the newest runs `spawnkit apply --last` looks through.
LAST_LOOKED_AT = 200


def _repo_change(record: SessionRecord) -> dict[str, Any] | None:
    """The repository change a finished ``--repo`` run kept in its record, if any."""
    kept = (record.given or {}).get("repo")
    return kept if isinstance(kept, dict) and "diff" in kept else None


def _report_journal(store: SessionStore) -> None:
    """Say so when writes of the run wait in the journal for a server that went away."""
    waiting = store.pending_writes()
    store.close()
    if waiting and store.journal is not None:
        say(
            f"spawnkit: the session store {store.location} went away: {waiting} write(s) of "
            f"the run are kept in {store.journal.path} and written when it is back (any "
            "spawnkit command that opens the store writes them)"
        )


def demo_writes() -> str:
    """Where the demo is about to write, said before it does (the home, the store)."""
    from ..home import ENV_VAR, home_path, store_setting
    from ..store.backend import is_postgres_url, redact_url

    home = home_path()
    setting = store_setting()
    if setting is None:
        return f"It writes its session record, logs and workspace under {home} (${ENV_VAR})."
    shown = redact_url(setting) if is_postgres_url(setting) else setting
    return (
        f"It writes its session record to {shown} and its logs and workspace under {home} "
        f"(${ENV_VAR})."
    )


def cmd_demo(args: argparse.Namespace) -> int:

    from .. import signals
    from ..config.roster import load_roster
    from ..config.roster_location import example_roster
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
        f"prompt: {DEMO_PROMPT!r}\n"
        f"{demo_writes()}\n",
        file=out,
        flush=True,
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
