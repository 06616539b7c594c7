"""``spawnkit sessions`` and ``spawnkit history``: what was recorded. One session or a
table of them from the store; tokens, cost and tool calls summed up from the store or
the CLIs' own transcripts, which ``history import`` copies into the store and
``history export`` writes as Parquet for DuckDB."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from ..errors import SpawnkitError
from .parsing import Commands, row_count
from .reporting import EXIT_OK

HISTORY_SOURCES = ["store", "claude-code", "claude", "codex", "gemini"]


def add_sessions(commands: Commands) -> None:
    sessions = commands.add_parser("sessions", help="list recorded sessions, or show one")
    sessions.add_argument("session_id", nargs="?", help="show this session (a prefix is enough)")
    sessions.add_argument("--butler", help="only this butler")
    sessions.add_argument("--status", help="only this status (success, failed, cancelled, ...)")
    sessions.add_argument("-n", "--limit", type=row_count, default=20, help="at most this many")
    sessions.add_argument("--json", action="store_true")


def add_history(commands: Commands) -> None:
    hist = commands.add_parser("history", help="tokens, cost and tool calls, summed up")
    hist.add_argument("--source", choices=HISTORY_SOURCES, default="store",
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
        "--source", dest="import_sources", action="append", choices=HISTORY_SOURCES[1:],
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
        choices=["spawnkit", *HISTORY_SOURCES[1:]],
        help="spawnkit (the store) or a CLI (repeatable; default: all)",
    )  # fmt: skip


def cmd_sessions(args: argparse.Namespace) -> int:
    from ..store import SessionStore
    from .console import Style, render_session, render_sessions_table

    store = SessionStore()  # opening it sweeps up the runs of dead owners (containment.sweep)
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
